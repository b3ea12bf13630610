"""Typing a call's string arguments by the tool's JSON schema, as vLLM 0.33.0's XML-style parsers do.

Owns: the coercion of one raw string value to the types its schema allows (null > integer > number >
boolean > object > array > string, the first that succeeds; a value none accepts stays a string) and
the arguments string that results. Reproduces `extract_types_from_schema` and `coerce_to_schema_type`
(vllm/tool_parsers/utils.py:1080-1242) and `ParserEngine._fix_arg_types` / `_coerce_dict`
(vllm/parser/engine/parser_engine.py:292-345, 437-462), at
https://github.com/vllm-project/vllm/blob/v0.33.0/. vLLM 0.19.1 and SGLang type differently
(docs/parsers.md §4). Does not own: finding the raw values (qwen3_coder.py, glm.py).

    tools = (ToolSpec("f", {"properties": {"count": {"type": "integer"}}}),)
    arguments({"count": "42", "name": "x"}, "f", tools)  # '{"count": 42, "name": "x"}'
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from modeltap.compat.parsers.base import ToolSpec

# The order vLLM tries a value's allowed types in (utils.py:1175-1184).
_TYPE_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")

# Schema type spellings vLLM folds into the JSON-schema names (utils.py:1126-1150).
_TYPE_ALIASES = {
    "str": "string",
    "text": "string",
    "varchar": "string",
    "char": "string",
    "enum": "string",
    "int": "integer",
    "int32": "integer",
    "int64": "integer",
    "uint": "integer",
    "uint32": "integer",
    "uint64": "integer",
    "long": "integer",
    "short": "integer",
    "unsigned": "integer",
    "float": "number",
    "float32": "number",
    "float64": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "arr": "array",
    "list": "array",
    "sequence": "array",
}

# A coercion that fails: the value is tried against the next allowed type.
_NO_MATCH = object()


def schema_types(schema: object) -> set[str]:
    """The types a property's schema allows: `type` (a name or a list), the kinds of its `enum`
    values, and those of `anyOf` / `oneOf` / `allOf` branches; `{"string"}` when it says nothing."""
    if not isinstance(schema, Mapping):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        types.update(_enum_kind(value) for value in enum if _enum_kind(value))
    for choice in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(choice)
        if isinstance(branches, list):
            for branch in branches:
                types.update(schema_types(branch))
    return types or {"string"}


def _enum_kind(value: object) -> str:
    # bool before int: True is an int to Python, a boolean to JSON schema.
    for kind, python_type in (
        ("boolean", bool),
        ("integer", int),
        ("number", float),
        ("string", str),
        ("array", list),
        ("object", dict),
    ):
        if isinstance(value, python_type):
            return kind
    return "null" if value is None else ""


def coerce(value: str, types: set[str]) -> Any:
    """`value` as the first of `types` (in vLLM's priority) that accepts it; a value no allowed type
    accepts is parsed as JSON when that gives a finite value, and otherwise stays the string."""
    allowed = {_TYPE_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for candidate in _TYPE_PRIORITY:
        if candidate not in allowed:
            continue
        if candidate == "string":
            return value
        coerced = _as_type(value, candidate)
        if coerced is not _NO_MATCH:
            return coerced
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def _as_type(value: str, kind: str) -> Any:
    if kind == "null":
        return None if value.lower() == "null" else _NO_MATCH
    if kind == "integer":
        return _int(value)
    if kind == "number":
        return _number(value)
    if kind == "boolean":
        word = value.lower().strip()
        return True if word in ("true", "1") else False if word in ("false", "0") else _NO_MATCH
    try:  # object, array
        parsed = json.loads(value)
    except ValueError:
        return _NO_MATCH
    return parsed if _finite(parsed) else _NO_MATCH


def _int(value: str) -> Any:
    try:
        return int(value)
    except ValueError:
        return _NO_MATCH


def _number(value: str) -> Any:
    as_int = _int(value)
    if as_int is not _NO_MATCH:
        return as_int
    try:
        number = float(value)
    except ValueError:
        return _NO_MATCH
    if not math.isfinite(number):
        return _NO_MATCH
    return number if number != int(number) else int(number)


def _finite(parsed: object) -> bool:
    """Whether `parsed` serialises to valid JSON (no inf or nan anywhere in it)."""
    try:
        json.dumps(parsed, allow_nan=False)
    except ValueError:
        return False
    return True


def properties_of(tools: tuple[ToolSpec, ...], name: str) -> Mapping[str, Any]:
    """The `properties` of the first tool called `name` ({} for an unknown tool or none declared)."""
    for tool in tools:
        if tool.name == name:
            found = (tool.parameters or {}).get("properties", {})
            return found if isinstance(found, Mapping) else {}
    return {}


def coerce_object(values: dict[str, Any], properties: Mapping[str, Any]) -> bool:
    """Type, in place, the values of a JSON object by `properties` (nested objects by their own
    `properties`, arrays item by item by `items`); return whether any value changed
    (`ParserEngine._coerce_dict` / `_coerce_value`)."""
    changed = False
    for key, value in values.items():
        schema = properties.get(key)
        if isinstance(schema, Mapping):
            typed, value_changed = _coerce_value(value, schema)
            if value_changed:
                values[key] = typed
                changed = True
    return changed


def _coerce_value(value: Any, schema: Mapping[str, Any]) -> tuple[Any, bool]:
    if isinstance(value, str):
        typed = coerce(value, schema_types(schema))
        return typed, typed is not value
    if isinstance(value, dict):
        nested = schema.get("properties")
        return value, isinstance(nested, Mapping) and coerce_object(value, nested)
    if isinstance(value, list):
        items = schema.get("items")
        if not isinstance(items, Mapping):
            return value, False
        changed = False
        for i, item in enumerate(value):
            typed, item_changed = _coerce_value(item, items)
            if item_changed:
                value[i] = typed
                changed = True
        return value, changed
    # A number, boolean or null is re-read from its JSON text, as a string value would be.
    typed = coerce(json.dumps(value, ensure_ascii=False), schema_types(schema))
    return (typed, True) if type(typed) is not type(value) or typed != value else (value, False)


def arguments(values: dict[str, str], name: str, tools: tuple[ToolSpec, ...]) -> str:
    """The arguments string vLLM emits for raw string `values` of a call to `name`: each value typed
    by its property's schema, then `json.dumps(..., ensure_ascii=False)`."""
    typed: dict[str, Any] = dict(values)
    if tools and name:
        coerce_object(typed, properties_of(tools, name))
    return json.dumps(typed, ensure_ascii=False)
