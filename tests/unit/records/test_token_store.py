"""modeltap/records/token_store.py with the real writer, and what the readers make of it: sessions with
an exact token history and with each kind of break, the first break on the session row, the tokens
export (token_export.py) and `show` marking the turn (view.py)."""

from __future__ import annotations

import io
import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from transformers import AutoTokenizer

from modeltap.dialects.token_ids import TokenIds, common_prefix
from modeltap.exporters.export import write_export
from modeltap.readers.sessions import sessions_table
from modeltap.readers.show import session_turns, turn_text
from modeltap.records.reader import StoreReader
from modeltap.records.schema import SCHEMA_VERSION, migrate
from modeltap.records.turns import turns
from modeltap.testing import exchange
from tests import echo_changes as echoes
from tests.factories import chat_completion, recorded, usage
from tests.standins import token_engine as te
from tests.token_sessions import ASK, SYSTEM, TOOLS, served_turn, tool_session

# Qwen3's <|im_end|> and <|endoftext|>, for the sessions on the real tokenizer.
IM_END, END_OF_TEXT = 151645, 151643
# The stand-in tokenizer's ids that end a generated turn, as serve learns them from the served one.
TURN_ENDS = frozenset({te.IM_END, te.END_OF_TEXT})


async def record(tmp_path: Path, *exchanges: Any, turn_ends: frozenset[int] = TURN_ENDS) -> StoreReader:
    return StoreReader(await recorded(tmp_path / "r.db", *exchanges, turn_ends=turn_ends))


def export(reader: StoreReader, session: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    write_export(reader, session, "tokens", out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def drift_of(reader: StoreReader, session: str = "s") -> dict[str, Any] | None:
    [row] = [s for s in reader.sessions() if s["id"] == session]
    return row["token_drift"]


async def test_an_exact_session_exports_one_line_of_the_last_prompt_and_completion(tmp_path: Path) -> None:
    histories, replies = tool_session()
    reader = await record(
        tmp_path,
        *[served_turn(h, r, session_id="s", logprobs=True) for h, r in zip(histories, replies, strict=True)],
    )
    assert drift_of(reader) is None
    [line] = export(reader, "s")
    prompts = [te.render(h, TOOLS) for h in histories]
    completions = [
        te.completion("", [("bash", {"command": "echo $((6 * 7))"})]),
        te.completion("42"),
        te.completion("48"),
    ]
    assert line["input_ids"] == prompts[-1] + completions[-1]
    assert (line["turns"], line["stretch"], line["source"], line["format_version"]) == (
        [1, 2, 3],
        0,
        "served",
        2,
    )
    assert line["rendered_turns"] == [] and line["weight_versions"] == [None] * 3
    expected_mask = [0] * len(line["input_ids"])
    for prompt, completion in zip(prompts, completions, strict=True):
        expected_mask[len(prompt) : len(prompt) + len(completion)] = [1] * len(completion)
    assert line["loss_mask"] == expected_mask
    # Logprobs sit exactly on the completion ids, null elsewhere.
    assert [p is not None for p in line["logprobs"]] == [bool(m) for m in line["loss_mask"]]
    assert line["logprobs"][len(prompts[0])] == 0.0 and line["break_after"] is None
    # As `torch.tensor` takes them (docs/token-ids.md §5): flat, equally long, ints, 0/1, floats or null.
    assert len(line["input_ids"]) == len(line["loss_mask"]) == len(line["logprobs"])
    assert {type(i) for i in line["input_ids"]} == {int} and set(line["loss_mask"]) == {0, 1}
    assert {type(p) for p in line["logprobs"]} == {float, type(None)}


async def test_a_long_session_costs_about_its_final_length_in_ids(tmp_path: Path) -> None:
    # 50 turns growing to ~20k ids: stored as shared prefixes, the ids cost about the final sequence,
    # not the ~500k ids of all the turns' prompts together.
    rng = random.Random(3)
    history: list[dict[str, Any]] = [SYSTEM, ASK]
    exchanges, total_prompt_ids = [], 0
    for turn in range(50):
        reply = {
            "role": "assistant",
            "content": f"step {turn}: " + " ".join(str(rng.random()) for _ in range(8)),
        }
        exchanges.append(served_turn(list(history), reply, session_id="long"))
        total_prompt_ids += len(te.render(history, TOOLS))
        history += [reply, {"role": "user", "content": " ".join(str(rng.random()) for _ in range(12))}]
    reader = await record(tmp_path, *exchanges)
    [line] = export(reader, "long")
    final_ids = len(line["input_ids"])
    assert 18_000 < final_ids < 30_000 and total_prompt_ids > 15 * final_ids
    # Within 1.25x of the final sequence packed as 4-byte ids (compression only helps), and the
    # responses do not keep a second copy of each turn's prompt ids.
    sizes = reader.size_bytes()
    assert sizes["token_ids"] < 1.25 * 4 * final_ids and sizes["responses"] < 4 * final_ids
    assert reader.exchanges("long")[-1]["response"]["prompt_token_ids"].endswith(" token ids>")


def served(histories: list[Any], replies: list[Any], at: int | None = None, **override: Any) -> list[Any]:
    """Session "s": each history answered with its reply, turn `at` (from 0) served with `override`."""
    return [
        served_turn(h, r, session_id="s", **(override if i == at else {}))
        for i, (h, r) in enumerate(zip(histories, replies, strict=True))
    ]


def edited_session(edit: Any) -> list[Any]:
    """The tool session with its third request's history changed by `edit`."""
    histories, replies = tool_session()
    histories[2] = edit(histories[2])
    return served(histories, replies)


def echo(**fields: Any) -> Any:
    """An edit of the echoed answer (message 4 of the third history)."""
    return lambda history: [*history[:4], {**history[4], **fields}, *history[5:]]


@pytest.mark.parametrize(
    ("edit", "kind", "message"),
    [
        (echo(content="41"), "assistant_text_changed", 4),
        (
            lambda h: [
                *h[:2],
                {
                    **h[2],
                    "tool_calls": [
                        {
                            **h[2]["tool_calls"][0],
                            "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                        }
                    ],
                },
                *h[3:],
            ],
            "message_edited",
            2,
        ),
        (lambda h: [h[0], {"role": "user", "content": "What is 7 * 6?"}, *h[2:]], "message_edited", 1),
        (lambda h: [h[0], *h[2:]], "message_removed", 1),
        (lambda h: [*h[:4], h[5]], "reply_missing", 4),
    ],
)
async def test_each_kind_of_break_is_found_at_its_turn_and_cuts_the_export(
    tmp_path: Path, edit: Any, kind: str, message: int
) -> None:
    reader = await record(tmp_path, *edited_session(edit))
    drift = drift_of(reader)
    assert drift is not None
    assert (drift["turn"], drift["continues_turn"], drift["kind"], drift["message"]) == (3, 2, kind, message)
    lines = export(reader, "s")
    assert [line["turns"] for line in lines] == [[1, 2], [3]]
    assert lines[0]["break_after"]["kind"] == kind
    expected, got = drift["expected"], drift["got"]
    position = drift["position"]
    assert expected["ids"][position - expected["start"]] != got["ids"][position - got["start"]]


async def test_tool_call_arguments_changed_when_the_echoed_call_is_another(tmp_path: Path) -> None:
    # The second turn's request echoes the first turn's call with other arguments.
    histories, replies = tool_session()
    changed = {
        **replies[0],
        "tool_calls": [
            {**replies[0]["tool_calls"][0], "function": {"name": "bash", "arguments": '{"command": "date"}'}}
        ],
    }
    histories[1] = [*histories[1][:2], changed, histories[1][3]]
    reader = await record(tmp_path, *served(histories[:2], replies[:2]))
    drift = drift_of(reader)
    assert drift is not None and (drift["turn"], drift["kind"], drift["message"]) == (
        2,
        "tool_call_arguments_changed",
        2,
    )


async def test_reasoning_dropped_by_the_agent(tmp_path: Path) -> None:
    histories, replies = tool_session()
    replies[1] = {"role": "assistant", "content": "42", "reasoning_content": "The shell said 42."}
    reader = await record(tmp_path, *served(histories, replies))
    drift = drift_of(reader)
    assert drift is not None and (drift["turn"], drift["kind"]) == (3, "reasoning_dropped")


async def test_tools_changed(tmp_path: Path) -> None:
    histories, replies = tool_session()
    more = [*TOOLS, {"type": "function", "function": {"name": "read", "parameters": {}}}]
    drift = drift_of(await record(tmp_path, *served(histories, replies, at=2, tools=more)))
    assert drift is not None and (drift["turn"], drift["kind"], drift["message"]) == (
        3,
        "tools_changed",
        None,
    )


async def test_a_reply_sampled_as_other_ids_than_its_text_encodes_to_is_rerendered(tmp_path: Path) -> None:
    histories, replies = tool_session()
    merged = te.completion("42", merged={"42": te.MERGED_BASE})
    drift = drift_of(await record(tmp_path, *served(histories, replies, at=1, completion=merged)))
    assert drift is not None and (drift["kind"], drift["message"], drift["role"]) == (
        "rerendered",
        4,
        "assistant",
    )
    assert drift["position"] == drift["previous_prompt_length"]


async def test_a_stop_token_the_template_renders_otherwise_keeps_the_stretch_with_the_sampled_id(
    tmp_path: Path,
) -> None:
    histories, replies = tool_session()
    ended = [*te.completion("42")[:-1], te.END_OF_TEXT]
    reader = await record(tmp_path, *served(histories, replies, at=1, completion=ended))
    assert drift_of(reader) is None
    [line] = export(reader, "s")
    position = len(te.render(histories[1], TOOLS)) + len(ended) - 1
    assert line["input_ids"][position] == te.END_OF_TEXT and line["loss_mask"][position] == 1
    # Without the served tokenizer the writer cannot tell a stop id from any other: it is a break.
    unknown = drift_of(
        await record(
            tmp_path / "u", *served(histories, replies, at=1, completion=ended), turn_ends=frozenset()
        )
    )
    assert unknown is not None and unknown["position"] == position


async def test_a_reply_echoed_with_one_character_more_is_a_break_at_its_end(tmp_path: Path) -> None:
    # The agent sends "42." back for the model's "42": the template renders "." where the model
    # stopped. A stop-id allowance that took any last id would have hidden it.
    reader = await record(tmp_path, *edited_session(echo(content="42.")))
    drift = drift_of(reader)
    assert drift is not None and (drift["turn"], drift["kind"]) == (3, "assistant_text_changed")
    assert drift["changes"] == [{"field": "content", "cause": "edited", "model": "42", "echoed": "42."}]
    assert drift["position"] == drift["expected_length"] - 1
    whitespace = drift_of(await record(tmp_path / "w", *edited_session(echo(content="42\n"))))
    assert whitespace is not None and whitespace["kind"] == "reply_reformatted"
    assert whitespace["text"].endswith("(message 5, assistant): content: whitespace")


async def test_side_requests_and_retries_do_not_break_the_main_line(tmp_path: Path) -> None:
    histories, replies = tool_session()
    title = served_turn(
        [{"role": "system", "content": "You are a title generator."}, ASK],
        {"role": "assistant", "content": "Arithmetic"},
        tools=[],
        session_id="s",
    )
    first, second, third = (
        served_turn(h, r, session_id="s") for h, r in zip(histories, replies, strict=True)
    )
    retry = served_turn(histories[1], replies[1], session_id="s")
    reader = await record(tmp_path, title, first, second, retry, third)
    assert drift_of(reader) is None
    rows = {row["turn"]: row for row in reader.token_turns("s")}
    assert rows[1]["continues"] is None and rows[2]["continues"] is None
    # The retry of turn 3 continues turn 2, as turn 3 did; turn 5 continues the latest of the two.
    assert rows[4]["continues"] == rows[2]["exchange_id"] == rows[3]["continues"]
    assert rows[5]["continues"] == rows[4]["exchange_id"]
    [line] = export(reader, "s")
    assert line["turns"] == [2, 4, 5]


async def test_rendered_ids_and_ids_asked_for_but_missing(tmp_path: Path) -> None:
    histories, replies = tool_session()
    plain = served_turn(histories[0], replies[0])
    assert plain.response is not None
    prompt, completion = plain.response["prompt_token_ids"], plain.response["choices"][0]["token_ids"]
    body = {"model": "m", "messages": histories[0], "tools": TOOLS}
    answer = chat_completion(replies[0], "tool_calls", usage=usage(1, 1))
    rendered_ids = TokenIds(prompt, completion, None, "rendered")
    reader = await record(
        tmp_path,
        exchange(body, answer, session_id="s", token_ids=rendered_ids, token_ask="rendered"),
        exchange(body, answer, session_id="t", token_ask="vllm: return_token_ids"),
        exchange(
            body,
            {"error": {"message": "boom"}},
            session_id="u",
            status=500,
            token_ask="vllm: return_token_ids",
        ),
    )
    assert reader.token_turns("u") == []  # a failed exchange has no ids to miss
    assert [(row["source"], row["prompt_length"]) for row in reader.token_turns("s")] == [
        ("rendered", len(prompt))
    ]
    assert export(reader, "s")[0]["source"] == "rendered"
    missing = reader.token_turns("t")
    assert [(row["source"], row["ask"]) for row in missing] == [(None, "vllm: return_token_ids")]
    listed = turns(reader.exchanges("t"), tokens=missing, full=True)
    assert "none came back (asked vllm: return_token_ids)" in turn_text(listed[0])
    with pytest.raises(ValueError, match="no token ids"):
        export(reader, "t")


async def test_show_and_sessions_mark_the_break(tmp_path: Path) -> None:
    reader = await record(tmp_path, *edited_session(echo(content="41")))
    table = sessions_table(reader.sessions())
    assert table.splitlines()[0].split()[6] == "DRIFT" and "#3" in table.splitlines()[1]
    rows, tokens = reader.exchanges("s"), reader.token_turns("s")
    text = session_turns("s", rows, tokens=tokens)
    [marked] = [line for line in text.splitlines() if "token drift" in line]
    assert "continuing #2" in marked and "text came back changed" in marked
    full = turn_text(turns(rows, full=True, tokens=tokens)[2])
    assert "token ids served" in full and "expected" in full and "got" in full
    drift = turns(rows, tokens=tokens)[2].token_drift
    assert drift is not None and drift.turn == 3


def test_a_store_of_the_previous_version_migrates(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    from modeltap.records.schema import MIGRATIONS

    conn.executescript(MIGRATIONS[0])
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO sessions (id, created) VALUES ('old', 1.0)")
    assert migrate(conn) == SCHEMA_VERSION
    conn.close()
    with StoreReader(path) as reader:
        assert reader.sessions()[0]["token_drift"] is None and reader.token_turns("old") == []


async def test_a_completions_session_continues_its_last_turn(tmp_path: Path) -> None:
    def turn(prompt: list[int], completion: list[int]) -> Any:
        choice = {
            "index": 0,
            "text": "x",
            "finish_reason": "stop",
            "prompt_token_ids": prompt,
            "token_ids": completion,
        }
        return exchange(
            {"model": "m", "prompt": "x"}, {"choices": [choice]}, endpoint="completions", session_id="c"
        )

    reader = await record(
        tmp_path, turn([1, 2], [3]), turn([1, 2, 3, 4], [5]), turn([1, 2, 3, 4, 5, 6], [7]), turn([1, 9], [8])
    )
    rows = reader.token_turns("c")
    assert [row["shared"] for row in rows] == [None, 3, 5, 1]
    drift = drift_of(reader, "c")
    # Without a conversation to compare, a break inside the prompt it continues is an edit.
    assert drift is not None and (drift["turn"], drift["kind"], drift["message"]) == (
        4,
        "message_edited",
        None,
    )


def _oracle_ids(tokenizer: Any, history: list[dict[str, Any]]) -> list[int]:
    """A chat request's prompt ids as vLLM renders them: content None as "", arguments parsed."""
    messages = []
    for message in history:
        message = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            message["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in message["tool_calls"]
            ]
        messages.append(message)
    ids = tokenizer.apply_chat_template(
        messages, tools=echoes.TOOLS, add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@pytest.fixture(scope="module")
def qwen3_tokenizer(qwen_dir: str) -> Any:
    return AutoTokenizer.from_pretrained(qwen_dir, local_files_only=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=echoes.echo_cases())
async def test_observe_mode_names_each_echo_change_as_the_cause_of_its_break(
    qwen3_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory, case: echoes.EchoCase
) -> None:
    # The engine renders each request again (observe mode): turn 1's ids are the model's, turn 2's
    # prompt is the re-render of a history whose echo carries the change.
    first = _oracle_ids(qwen3_tokenizer, case.first_history)
    completion = [*qwen3_tokenizer.encode(case.completion_text, add_special_tokens=False), IM_END]
    second = _oracle_ids(qwen3_tokenizer, case.second_history)
    turns = [
        exchange(
            {"model": "m", "messages": history, "tools": echoes.TOOLS},
            chat_completion(reply, "tool_calls", usage=usage(len(prompt), len(ids))),
            session_id="s",
            token_ids=TokenIds(prompt, ids, None, "served"),
        )
        for history, reply, prompt, ids in (
            (case.first_history, case.reply, first, completion),
            (case.second_history, {"role": "assistant", "content": "3"}, second, [18, IM_END]),
        )
    ]
    reader = await record(tmp_path_factory.mktemp("echo"), *turns, turn_ends=frozenset({IM_END, END_OF_TEXT}))
    drift = drift_of(reader)
    broke = second[: len(first) + len(completion)] != first + completion
    assert (drift is not None) == broke, (case.kind, drift)
    if drift is None:
        return
    assert drift["turn"] == 2 and drift["position"] == common_prefix(first + completion, second)
    found = (drift["kind"], [(c["field"], c["cause"]) for c in drift["changes"]])
    if case.kind in echoes.EXPECTED_BREAK:
        assert found == echoes.EXPECTED_BREAK[case.kind], case
    else:  # the echo is the reply; the template wrote it otherwise (or dropped its reasoning)
        assert found[0] in ("rerendered", "reasoning_dropped") and found[1] == [], case


async def test_each_turns_weight_version_and_seed_are_recorded_and_exported(tmp_path: Path) -> None:
    histories, replies = tool_session()
    versions, seeds = ["v1", None, "v2"], [7, None, 2**70]  # a seed SQLite cannot hold is left out
    turns = [
        served_turn(h, r, session_id="s", weight_version=v, seed=seed)
        for h, r, v, seed in zip(histories, replies, versions, seeds, strict=True)
    ]
    reader = await record(tmp_path, *turns)
    rows = reader.token_turns("s")
    assert [(row["weight_version"], row["seed"]) for row in rows] == [("v1", 7), (None, None), ("v2", None)]
    [line] = export(reader, "s")
    assert line["weight_versions"] == versions and line["seeds"] == [7, None, None]


async def test_a_rendered_turn_is_marked_and_masked_to_its_reply_text(tmp_path: Path) -> None:
    histories, replies = tool_session()
    served = [served_turn(h, r, session_id="s") for h, r in zip(histories[:2], replies[:2], strict=True)]
    prompt = te.render(histories[2], TOOLS)
    completion = te.completion("48")
    # The renderer's mask: the text's ids, not the template's end of turn it wrote after a length stop.
    mask = [1] * (len(completion) - 1) + [0]
    rendered = served_turn(
        histories[2],
        replies[2],
        session_id="s",
        token_ids=TokenIds(prompt, completion, None, "rendered", mask=mask),
    )
    reader = await record(tmp_path, *served, rendered)
    [line] = export(reader, "s")
    assert line["source"] == "mixed" and line["rendered_turns"] == [3]
    assert line["loss_mask"][len(prompt) :] == mask
    assert reader.token_turns("s")[2]["mask"] == mask
