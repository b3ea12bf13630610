"""The token ids an engine says it used, read from an OpenAI chat or completions body.

Owns: `TokenIds` (one exchange's prompt ids, completion ids and the completion's logprobs, served or
rendered), reading them from every documented response shape of vLLM and SGLang, and merging the ids
a stream spreads over its chunks into the shapes a non-streamed body has (the assembler of chat and
completions calls `merge_chunk_ids`, so a stream and a body read alike). Does not own: asking for them
(compat/engines.py says which fields), rendering ids where the server gave none (proxy/token_recorder.py),
storing or checking them (records/).

The shapes (docs/engines.md §6):

| where | prompt ids | completion ids |
|---|---|---|
| vLLM chat | top-level `prompt_token_ids` | `choices[i].token_ids` |
| vLLM / SGLang completions | `choices[i].prompt_token_ids` | `choices[i].token_ids` |
| SGLang chat, `return_token_ids` | `choices[i].prompt_token_ids` | `choices[i].response_token_ids` |
| SGLang chat, sglext | `sglext.input_ids` | `sglext.output_ids[i]` |

(SGLang 0.5.17 named the chat completion ids `token_ids`.) Logprobs are the sampled tokens'
`logprob`s, kept when their count equals the completion's (chat `logprobs.content[]`, completions
`logprobs.token_logprobs`); otherwise they are left out, as they would be misplaced.

    ids = served_ids(body, chat_logprobs)     # TokenIds(prompt=[...], completion=[...], ...) or None
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from modeltap.dialects.base import as_dict, as_float, first_choice
from modeltap.dialects.sse import index_of, list_of

TokenSource = Literal["served", "rendered", "built"]
LogprobReader = Callable[[dict[str, Any]], list[float | None] | None]


@dataclass(frozen=True, slots=True)
class TokenIds:
    """One exchange's ids: the prompt the model saw, the completion it sampled, and the completion's
    logprobs (one per completion id, None where the server gave none). `source` is "served" when the
    engine returned them (`--tokens observe`), "built" when modeltap built the prompt and the engine
    generated from it (`--tokens exact`), "rendered" when modeltap rendered and encoded them with the
    served tokenizer (the engine returned none). `weight_version` is the policy version the engine
    reports for the completion (SGLang's `weight_version`, vLLM 0.33's last `weight_versions` span).
    `mask` marks, for rendered ids only, which completion ids the reply's own text encodes to (1) and
    which the template wrote around it (0); None means every completion id is the model's."""

    prompt: list[int]
    completion: list[int]
    logprobs: list[float | None] | None = None
    source: TokenSource = "served"
    weight_version: str | None = None
    mask: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Generated:
    """What an engine's token endpoint answered for one choice: its `index`, the generated `ids` (in a
    stream chunk, the new ones, or all so far where the engine streams them `cumulative`), their
    `logprobs` (None where the engine gave none or not one per id), the finish reason when the choice
    ended (`stop`, `length`, `abort`), and the weight version the engine reports for it."""

    index: int
    ids: list[int]
    logprobs: list[float | None] | None = None
    finish_reason: str | None = None
    weight_version: str | None = None
    cumulative: bool = False


def served_ids(response: Any, logprobs: LogprobReader) -> TokenIds | None:
    """The first choice's ids in `response` (a non-streamed body, or an assembled stream), or None
    when it holds no prompt ids or no completion ids. `logprobs` reads a choice's logprobs."""
    body = as_dict(response)
    choice = first_choice(body.get("choices"))
    sglext = as_dict(body.get("sglext"))
    outputs = list_of(sglext.get("output_ids"))
    prompt = _first_ids(body.get("prompt_token_ids"), choice.get("prompt_token_ids"), sglext.get("input_ids"))
    completion = _first_ids(
        choice.get("token_ids"), choice.get("response_token_ids"), outputs[0] if outputs else None
    )
    if prompt is None or completion is None:
        return None
    sampled = logprobs(choice)
    aligned = sampled is not None and len(sampled) == len(completion)
    return TokenIds(
        prompt, completion, sampled if aligned else None, weight_version=_weight_version(body, choice)
    )


def _weight_version(body: dict[str, Any], choice: dict[str, Any]) -> str | None:
    """The policy version a chat or completions answer reports: vLLM 0.33's `weight_versions` spans
    of the choice (the last one's), or SGLang's `metadata.weight_version` (docs/exact.md §4)."""
    spans = [span for span in list_of(choice.get("weight_versions")) if isinstance(span, dict)]
    version = spans[-1].get("version") if spans else as_dict(body.get("metadata")).get("weight_version")
    return version if isinstance(version, str) else None


def without_ids(response: dict[str, Any]) -> dict[str, Any]:
    """A copy of `response` whose id lists `served_ids` reads (the prompt's, and the first choice's
    completion) each read `"<N token ids>"`: the record stores ids once, as shared prefixes
    (records/token_store.py), not again in every turn's body."""
    body = dict(response)
    if "prompt_token_ids" in body:
        body["prompt_token_ids"] = _marker(body["prompt_token_ids"])
    sglext = body.get("sglext")
    if isinstance(sglext, dict):
        outputs = list_of(sglext.get("output_ids"))
        body["sglext"] = {**sglext, "input_ids": _marker(sglext.get("input_ids"))}
        if outputs:
            body["sglext"]["output_ids"] = [_marker(outputs[0]), *outputs[1:]]
    choices = list_of(body.get("choices"))
    first = first_choice(choices)
    if first:
        marked = {key: _marker(first.get(key)) for key in _CHOICE_ID_KEYS if key in first}
        body["choices"] = [{**choice, **marked} if choice is first else choice for choice in choices]
    return body


def chat_logprobs(choice: dict[str, Any]) -> list[float | None] | None:
    """`logprobs.content[].logprob` of a chat choice."""
    content = as_dict(choice.get("logprobs")).get("content")
    if not isinstance(content, list) or not content:
        return None
    return [as_float(entry.get("logprob")) if isinstance(entry, dict) else None for entry in content]


def completion_logprobs(choice: dict[str, Any]) -> list[float | None] | None:
    """`logprobs.token_logprobs` of a completions choice."""
    values = as_dict(choice.get("logprobs")).get("token_logprobs")
    if not isinstance(values, list) or not values:
        return None
    return [as_float(value) for value in values]


def merge_chunk_ids(body: dict[str, Any], chunk: dict[str, Any], choices: dict[int, dict[str, Any]]) -> None:
    """Fold one stream chunk's ids into `body` (the stream's top-level fields) and `choices` (each
    choice's state by index): vLLM's top-level `prompt_token_ids` on the first chat chunk, each choice's
    `prompt_token_ids` (completions), `token_ids` deltas and `weight_versions` (on the last chunk), SGLang's
    trailing `sglext` chunk and its `metadata` (the weight version).
    Lists are taken as they come, on the event loop; `served_ids` checks them, off it."""
    prompt = chunk.get("prompt_token_ids")
    if isinstance(prompt, list):
        body["prompt_token_ids"] = prompt
    if isinstance(chunk.get("metadata"), dict):
        body["metadata"] = chunk["metadata"]
    sglext = chunk.get("sglext")
    if isinstance(sglext, dict):
        merged = body.setdefault("sglext", {})
        for key in ("input_ids", "output_ids"):
            if key in sglext:
                merged[key] = sglext[key]
    for choice in list_of(chunk.get("choices")):
        if not isinstance(choice, dict):
            continue
        state = choices.setdefault(index_of(choice.get("index")), {})
        ids = choice.get("prompt_token_ids")
        if isinstance(ids, list):
            state["prompt_token_ids"] = ids
        delta = choice.get("token_ids")
        if isinstance(delta, list):
            state.setdefault("token_ids", []).extend(delta)
        if isinstance(choice.get("weight_versions"), list):
            state["weight_versions"] = choice["weight_versions"]


_INT = frozenset({int})
# The id lists a choice may carry (served_ids reads them in this order).
_CHOICE_ID_KEYS = ("prompt_token_ids", "token_ids", "response_token_ids")


def _marker(value: Any) -> Any:
    return f"<{len(value)} token ids>" if isinstance(value, list) else value


def _first_ids(*candidates: Any) -> list[int] | None:
    for candidate in candidates:
        ids = id_list(candidate)
        if ids is not None:
            return ids
    return None


def id_list(value: Any) -> list[int] | None:
    """`value` when it is a list of token ids (ints, not bools, within uint32), else None. Checked in
    C, not by a Python loop: a 20k-id prompt costs a fraction of a millisecond."""
    if not isinstance(value, list):
        return None
    try:
        array("I", value)
    except (TypeError, OverflowError):
        return None
    return value if set(map(type, value)) <= _INT else None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids `a` and `b` share. Compares 4-byte packed ids in halving slices
    (memcmp), so two 100k-id prompts cost microseconds, not a Python loop over every id."""
    left, right = _packed(a), _packed(b)
    low, high = 0, min(len(a), len(b))
    if left[: 4 * high] == right[: 4 * high]:
        return high
    # Invariant: the first `low` ids agree; the first `high` do not.
    while high - low > 1:
        middle = (low + high) // 2
        if left[4 * low : 4 * middle] == right[4 * low : 4 * middle]:
            low = middle
        else:
            high = middle
    return low


def _packed(ids: Sequence[int]) -> memoryview:
    packed = ids if isinstance(ids, array) and ids.typecode == "I" else array("I", ids)
    return memoryview(packed).cast("B")
