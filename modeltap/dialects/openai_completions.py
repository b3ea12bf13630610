"""OpenAI legacy completions: `POST /v1/completions`, a text prompt in, text choices out.

Owns: the route, `max_tokens` as its completion cap, the prompt (text, token ids, or a batch of
either, rendered by no template), its stream (`text_completion` chunks ending in `[DONE]`) in both
directions, and what a turn added (the text appended to the previous prompt). Also the choice-chunk
assembly OpenAI chat shares (`ChoiceChunks`: chunk header, choices by index, usage, logprobs).
"""

from __future__ import annotations

from typing import Any, ClassVar

from modeltap.dialects.base import Prompt, Reading, TextPrompt, as_dict, as_str, dicts_in, first_choice
from modeltap.dialects.roles import AsChat, CountsPrompt, OpenAIShaped, ThroughChat, TokenEndpoint
from modeltap.dialects.sse import DONE, DONE_EVENT, Pieces, data_event, index_of, list_of
from modeltap.dialects.token_ids import (
    Generated,
    TokenIds,
    completion_logprobs,
    id_list,
    merge_chunk_ids,
    served_ids,
)


class ChoiceChunks:
    """An OpenAI chunk stream (chat or legacy completions): the chunk header, choices by index, usage,
    and the token ids an engine streams (dialects/token_ids.py). Subclasses merge a choice's own fields."""

    END: ClassVar[str] = DONE
    OBJECT: ClassVar[str]
    _HEAD = ("id", "created", "model", "system_fingerprint")

    def __init__(self) -> None:
        self._head: dict[str, Any] = {}
        self._usage: Any = None
        self._choices: dict[int, dict[str, Any]] = {}
        self._pieces = Pieces()
        self._ids: dict[str, Any] = {}
        self._choice_ids: dict[int, dict[str, Any]] = {}

    def add(self, obj: dict[str, Any]) -> bool:
        for key in self._HEAD:
            if key not in self._head and obj.get(key) is not None:
                self._head[key] = obj[key]
        if obj.get("usage"):
            self._usage = obj["usage"]
        for choice in list_of(obj.get("choices")):
            if isinstance(choice, dict):
                index = index_of(choice.get("index"))
                state = self._choices.setdefault(index, {"finish_reason": None})
                if choice.get("finish_reason") is not None:
                    state["finish_reason"] = choice["finish_reason"]
                self._merge(index, state, choice)
        merge_chunk_ids(self._ids, obj, self._choice_ids)
        return False

    def whole(self) -> bool:
        """Every choice has its finish reason: the stream said all it had to, [DONE] or not.
        `transformers serve` ends its streams at the finish chunk, which carries the usage, and
        never sends [DONE] (docs/engines.md §8); a stream cut before a choice finished is not whole."""
        return bool(self._choices) and all(
            state["finish_reason"] is not None for state in self._choices.values()
        )

    def body(self) -> dict[str, Any] | None:
        if not self._head and not self._choices and self._usage is None:
            return None
        body = {
            "id": self._head.get("id"),
            "object": self.OBJECT,
            "created": self._head.get("created"),
            "model": self._head.get("model"),
            "choices": [
                self._choice(index, self._choices[index]) | self._choice_ids.get(index, {})
                for index in sorted(self._choices)
            ],
            "usage": self._usage,
            **self._ids,
        }
        if "system_fingerprint" in self._head:
            body["system_fingerprint"] = self._head["system_fingerprint"]
        return body

    def _merge(self, index: int, state: dict[str, Any], choice: dict[str, Any]) -> None:
        raise NotImplementedError

    def _choice(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _merge_logprobs(self, state: dict[str, Any], logprobs: Any) -> None:
        """Logprobs come as lists per chunk (`content` in chat, `tokens`... in completions): extend."""
        if not isinstance(logprobs, dict):
            return
        merged = state.setdefault("logprobs", {})
        for key, value in logprobs.items():
            if isinstance(value, list):
                merged.setdefault(key, []).extend(value)


class _CompletionChunks(ChoiceChunks):
    OBJECT = "text_completion"

    def _merge(self, index: int, state: dict[str, Any], choice: dict[str, Any]) -> None:
        self._pieces.add(index, choice.get("text"))
        self._merge_logprobs(state, choice.get("logprobs"))

    def _choice(self, index: int, state: dict[str, Any]) -> dict[str, Any]:
        return {
            "index": index,
            "text": self._pieces.get(index),
            "logprobs": state.get("logprobs"),
            "finish_reason": state["finish_reason"],
        }


def usage_event(stamp: dict[str, Any], body: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The closing usage chunk (`choices: []`) when the request asked for one and the body has usage."""
    if include_usage and body.get("usage") is not None:
        return [data_event({**stamp, "choices": [], "usage": body["usage"]})]
    return []


class Completions(OpenAIShaped, TokenEndpoint, declines=(AsChat, ThroughChat, CountsPrompt)):
    """A text prompt: no conversation to read as chat."""

    name = "completions"
    route = "completions"
    operation = "text_completion"

    def check(self, body: dict[str, Any]) -> None:
        """`prompt` is text, token ids, or a list of either (OpenAI's four forms), nothing deeper."""
        prompt = body.get("prompt")
        if prompt is None or isinstance(prompt, str) or id_list(prompt) is not None:
            return
        if isinstance(prompt, list) and all(isinstance(p, str) or id_list(p) is not None for p in prompt):
            return
        raise ValueError("prompt must be text, a list of token ids, or a list of either")

    def completion_field(self, body: Any) -> str:
        return "max_tokens"

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        return TextPrompt(body.get("prompt"))

    def assembler(self) -> _CompletionChunks:
        return _CompletionChunks()

    def event_bytes(self, event: dict[str, Any]) -> bytes:
        return data_event(event)

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        stamp: dict[str, Any] = {k: body.get(k) for k in ("id", "created", "model") if k in body}
        stamp["object"] = "text_completion"
        events = [data_event({**stamp, "choices": [choice]}) for choice in list_of(body.get("choices"))]
        return [*events, *usage_event(stamp, body, include_usage), DONE_EVENT]

    def read(self, reply: dict[str, Any]) -> Reading:
        choice = first_choice(reply.get("choices"))
        return as_str(choice.get("finish_reason")), as_str(choice.get("text")), []

    def token_ids(self, request: Any, response: Any) -> TokenIds | None:
        return served_ids(response, completion_logprobs)

    def generated(self, body: Any, *, streamed: bool) -> list[Generated]:
        """Each choice's `token_ids` (in a stream, each chunk's new ones), `logprobs.token_logprobs`,
        finish reason, and vLLM's `weight_versions` (v0.33 and later, when asked), the last span's."""
        out = []
        for choice in dicts_in(as_dict(body).get("choices")):
            ids = id_list(choice.get("token_ids"))
            if ids is None:
                continue
            sampled = completion_logprobs(choice)
            versions = dicts_in(choice.get("weight_versions"))
            out.append(
                Generated(
                    index_of(choice.get("index")),
                    ids,
                    sampled if sampled is not None and len(sampled) == len(ids) else None,
                    as_str(choice.get("finish_reason")),
                    as_str(versions[-1].get("version")) if versions else None,
                )
            )
        return out

    def new_messages(self, request: Any, previous: Any) -> list[Any]:
        """One `{"role": "prompt"}` message holding what was appended to the previous prompt."""
        prompt, before = as_dict(request).get("prompt"), as_dict(previous).get("prompt")
        if not isinstance(prompt, str):
            return [] if prompt is None or prompt == before else [{"role": "prompt", "content": prompt}]
        if isinstance(before, str) and prompt.startswith(before):
            prompt = prompt[len(before) :]
        return [{"role": "prompt", "content": prompt}] if prompt else []


DIALECT = Completions()
