"""modeltap/compat/parsers/tool_schema.py: a raw string value typed as vLLM 0.33.0 types it (the first
allowed type that accepts it, a failure staying a string), and the arguments string that results."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeltap.compat.parsers.base import ToolSpec
from modeltap.compat.parsers.tool_schema import arguments, coerce, coerce_object, properties_of, schema_types


@pytest.mark.parametrize(
    ("value", "types", "expected"),
    [
        ("42", {"integer"}, 42),
        ("forty", {"integer"}, "forty"),  # a failed conversion stays a string
        ("4.5", {"integer"}, 4.5),  # not an int, but valid JSON: the fallback reads it
        ("5", {"number"}, 5),  # an integral number is an int
        ("5.0", {"number"}, 5),
        ("2.5", {"number"}, 2.5),
        ("1e999", {"number"}, "1e999"),  # not finite: kept as text
        ("nan", {"number"}, "nan"),
        ("True", {"boolean"}, True),
        (" 0 ", {"boolean"}, False),
        ("yes", {"boolean"}, "yes"),  # vLLM 0.19.1 and SGLang would say false
        ('{"mode": "w"}', {"object"}, {"mode": "w"}),
        ("{not json}", {"object"}, "{not json}"),
        ("[1e999]", {"array"}, "[1e999]"),
        ("null", {"string"}, "null"),  # null only where the schema allows it
        ("NULL", {"string", "null"}, None),
        ("7", {"string", "integer"}, 7),  # integer comes before string
        ("7", {"INT"}, 7),  # vLLM's spellings of the type names
        ("7", {"text"}, "7"),
        ('"quoted"', {"integer"}, "quoted"),  # the JSON fallback unquotes
        ("7", {"mystery"}, 7),
    ],
)
def test_a_value_takes_the_first_type_that_accepts_it(value: str, types: set[str], expected: Any) -> None:
    assert coerce(value, types) == expected
    assert type(coerce(value, types)) is type(expected)


@given(st.text())
def test_a_string_property_keeps_the_value_as_it_is(value: str) -> None:
    assert coerce(value, {"string"}) is value


@given(st.integers(-(10**100), 10**100))
def test_an_integer_property_reads_any_integer_text(number: int) -> None:
    assert coerce(str(number), {"integer"}) == number


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer"}, {"integer"}),
        ({"type": ["string", "null"]}, {"string", "null"}),
        (
            {"enum": [1, 2.5, True, None, "a", [], {}]},
            {"integer", "number", "boolean", "null", "string", "array", "object"},
        ),
        ({"anyOf": [{"type": "integer"}, {"oneOf": [{"type": "boolean"}]}]}, {"integer", "boolean"}),
        ({"description": "no type"}, {"string"}),
        ("not a schema", {"string"}),
    ],
)
def test_the_types_a_schema_allows(schema: object, expected: set[str]) -> None:
    assert schema_types(schema) == expected


TOOLS = (
    ToolSpec("f", {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}),
    ToolSpec("f", {"properties": {"n": {"type": "string"}}}),  # a second tool of the same name is not read
    ToolSpec("bare"),
)


def test_the_first_tool_of_a_name_gives_the_properties() -> None:
    assert properties_of(TOOLS, "f") == {"n": {"type": "integer"}, "s": {"type": "string"}}
    assert properties_of(TOOLS, "bare") == {}
    assert properties_of(TOOLS, "unknown") == {}


def test_arguments_are_typed_then_dumped_keeping_unicode_and_order() -> None:
    raw = {"s": "café", "n": "3", "other": "4"}
    assert arguments(raw, "f", TOOLS) == '{"s": "café", "n": 3, "other": "4"}'
    # An unknown tool, or no tools at all: every value stays a string.
    assert arguments(raw, "unknown", TOOLS) == '{"s": "café", "n": "3", "other": "4"}'
    assert arguments(raw, "f", ()) == '{"s": "café", "n": "3", "other": "4"}'


def test_a_json_object_is_typed_through_nested_properties_and_items() -> None:
    properties = {
        "outer": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "items": {"type": "array", "items": {"type": "boolean"}},
        "as_text": {"type": "string"},
        "exact": {"type": "integer"},
    }
    values: dict[str, Any] = {"outer": {"n": "1"}, "items": ["true", 0], "as_text": 5, "exact": 5}
    assert coerce_object(values, properties)
    assert values == {"outer": {"n": 1}, "items": [True, False], "as_text": "5", "exact": 5}
    assert not coerce_object({"exact": 5, "free": "x"}, properties)


def test_a_non_finite_number_is_never_produced() -> None:
    for text in ("1e999", "-1e999", "nan", "inf", "[1e999]"):
        typed = coerce(text, {"number", "array"})
        assert typed == text or not (isinstance(typed, float) and not math.isfinite(typed))
        json.dumps(typed, allow_nan=False)


def test_an_array_without_an_item_schema_is_left_alone() -> None:
    values: dict[str, Any] = {"tags": ["1"], "free": {"n": "1"}}
    assert not coerce_object(values, {"tags": {"type": "array"}, "free": {"type": "object"}})
    assert values == {"tags": ["1"], "free": {"n": "1"}}
