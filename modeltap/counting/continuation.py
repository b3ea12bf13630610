"""The prompt ids of a chat request in `serve --tokens exact`: the previous turn's own ids continued,
so that what a trainer trains on is what the model saw and produced.

Owns: building a request's prompt ids. Where its history continues a previous turn of the same
session (the same tools and template kwargs, every earlier message unchanged, and that turn's reply
echoed back with the same meaning), the prompt is the previous prompt's ids, then the completion's ids
exactly as the engine returned them (ended by the template's turn-end token), then the ids of what the
template renders for the new messages and the generation prompt. Otherwise, a full render, with the
reason the history did not continue. Also the one-time study of a template's turn end, and whether an
echoed reply means what the model said. Does not own: the turn memory of a session or talking to an
engine (proxy/exact.py), parsing the generated text into a reply (compat/parsers), or preparing a
body's messages as the engine does (counter.py, compat/prompts.py).

What the new messages render to is found by turn ends, not by prefixes: a template may rewrite earlier
turns when more messages follow (Qwen3 drops the reasoning of replies before the last user message),
which the previous ids never see again. The text after the K-th turn-end token of the render with the
new messages, where K turn ends close the render of the conversation up to the reply, is what they add;
only a window of the conversation is rendered (windows.py), so a turn costs what it adds.

    builder = PromptBuilder(counter)
    built = builder.build(dialects.named("chat"), body, session_turns)   # off the event loop
    built.ids, built.continued, built.reason
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from modeltap.counting.counter import CountError, Prepared
from modeltap.counting.template import ChatTemplate
from modeltap.counting.windows import RENDER_ERRORS, context, head_length, shape
from modeltap.dialects.base import same_message

if TYPE_CHECKING:
    from modeltap.counting.counter import TokenCounter
    from modeltap.dialects.roles import Dialect

# The text a study renders as a reply, to find what the template writes around a reply's content.
_MARKER = "\u2063modeltap-reply\u2063"


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """How the template ends an assistant turn: the added `token` right after the reply (`<|im_end|>`
    for Qwen), its id, and the ids that end a generated turn (the turn end and the tokenizer's
    end-of-text tokens), any of which the model may have stopped on."""

    token: str
    token_id: int
    stop_ids: frozenset[int]


@dataclass(frozen=True, slots=True)
class BuiltTurn:
    """A turn whose ids a later one may continue: its prompt ids, its request's messages as the engine
    prepared them, its tools and template kwargs, the indexes of messages the template may rewrite
    (windows.py), and per choice the completion ids as the engine returned them with the reply modeltap
    answered (an OpenAI chat assistant message)."""

    prompt: Sequence[int]
    messages: tuple[dict[str, Any], ...]
    tools: list[Any] | None
    kwargs: dict[str, Any]
    rewritable: tuple[int, ...]
    completions: tuple[Sequence[int], ...]
    replies: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class BuiltPrompt:
    """A request's prompt ids. `continued` names the choice of the previous turn whose prompt and
    completion the ids begin with (None: rendered in full, for `reason`); `shared` how many leading
    ids are the previous turn's own. `prepared` is the request as the engine prepares it, kept for the
    turn that follows."""

    ids: list[int]
    continued: int | None
    shared: int
    reason: str | None
    prepared: Prepared
    rewritable: tuple[int, ...] = field(default=())


class PromptBuilder:
    """Builds prompt ids with a counter's template, tokenizer and message preparation. Blocking: call
    `build` off the event loop. Raises ValueError at construction for a tokenizer whose ids cannot be
    decoded byte for byte, or a template whose assistant turns end in no added token."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        loaded = counter.tokenizer
        if loaded.token_bytes is None:
            raise ValueError(
                f"the tokenizer in {loaded.folder} is not a byte-level BPE: its generated ids cannot be "
                "decoded byte for byte, which `--tokens exact` needs (use --tokens observe)"
            )
        self.turn_end = study_turn_end(loaded.template, loaded.added_ids)

    def build(self, dialect: Dialect, body: dict[str, Any], earlier: Sequence[BuiltTurn]) -> BuiltPrompt:
        """The prompt ids of `body` (a request of `dialect`, chat), continuing the first of `earlier`
        (a session's turns, newest first) whose history it continues; else rendered in full, with the
        reason the newest was not continued. Raises CountError for a body the template cannot
        render."""
        prepared = self._counter.prepared(dialect, body)
        reason = "no earlier turn of this session"
        for number, previous in enumerate(earlier):
            choice, why = continues(previous, prepared)
            if choice is not None:
                built = self._continued(previous, choice, prepared)
                if built is not None:
                    return built
                why = "the template renders the new messages differently after a window"
            if number == 0:
                reason = why or reason
        return self._rendered(prepared, reason)

    def turn(
        self, built: BuiltPrompt, completions: Sequence[Sequence[int]], replies: Sequence[Mapping[str, Any]]
    ) -> BuiltTurn:
        """The turn `built`'s request became once answered: per choice, the completion ids as the
        engine returned them and the reply (an OpenAI chat assistant message), prepared as the engine
        prepares a message of a later request's history, so that an echo compares with it."""
        prepared = built.prepared
        # Kept as arrays: 4 bytes an id, where a list holds a pointer and an int object for each.
        return BuiltTurn(
            prompt=array("I", built.ids),
            messages=prepared.messages,
            tools=prepared.tools,
            kwargs=prepared.kwargs,
            rewritable=built.rewritable,
            completions=tuple(array("I", ids) for ids in completions),
            replies=tuple(self._counter.normalised(reply, prepared.tools) for reply in replies),
        )

    def _continued(self, previous: BuiltTurn, choice: int, prepared: Prepared) -> BuiltPrompt | None:
        known = len(previous.messages)
        context_messages = [*previous.messages, previous.replies[choice]]
        rewritable = (*previous.rewritable, *self._rewritable_among(context_messages, known, prepared))
        window = [context_messages[i] for i in self._window(context_messages, rewritable, prepared)]
        new = list(prepared.messages[known + 1 :])
        delta = self._after_reply(window, new, prepared)
        if delta is None:
            return None
        completion = list(previous.completions[choice])
        ends = self.turn_end
        if completion and completion[-1] in ends.stop_ids:
            completion[-1] = ends.token_id
        else:  # cut short (length, a stop string): the template still ends the turn
            completion.append(ends.token_id)
        head = [*previous.prompt, *completion]
        added = self._counter.tokenizer.encode_ids(delta)
        rewritable += tuple(known + 1 + i for i in self._rewritable_among(new, 0, prepared))
        return BuiltPrompt(
            [*head, *added],
            choice,
            len(previous.prompt) + len(previous.completions[choice]),
            None,
            prepared,
            rewritable,
        )

    def _rendered(self, prepared: Prepared, reason: str | None) -> BuiltPrompt:
        template = self._counter.tokenizer.template
        try:
            text = template.render(
                list(prepared.messages), tools=prepared.tools, add_generation_prompt=True, **prepared.kwargs
            )
        except RENDER_ERRORS as exc:
            raise CountError(f"cannot render the prompt of this request: {exc}") from exc
        rewritable = self._rewritable_among(list(prepared.messages), 0, prepared)
        return BuiltPrompt(self._counter.tokenizer.encode_ids(text), None, 0, reason, prepared, rewritable)

    def _window(
        self, messages: Sequence[dict[str, Any]], rewritable: Sequence[int], prepared: Prepared
    ) -> list[int]:
        windows = self._counter.tokenizer.stability.windows(prepared.kwargs, prepared.tools)
        if windows is None:
            return list(range(len(messages)))
        return context(len(messages), head_length(messages), rewritable)

    def _rewritable_among(
        self, messages: Sequence[dict[str, Any]], start: int, prepared: Prepared
    ) -> tuple[int, ...]:
        """Indexes (from `start`) of the messages of a shape the template rewrites when more follow."""
        windows = self._counter.tokenizer.stability.windows(prepared.kwargs, prepared.tools)
        kept = windows.rewritten if windows is not None else frozenset()
        return tuple(start + i for i, message in enumerate(messages[start:]) if shape(message) in kept)

    def _after_reply(
        self, window: list[dict[str, Any]], new: list[dict[str, Any]], prepared: Prepared
    ) -> str | None:
        """The text the template renders after the reply's turn-end token for `new` and the
        generation prompt: found after the K-th turn end of the render with `new`, where K turn ends
        close the render of `window` (which ends with the reply)."""
        template: ChatTemplate = self._counter.tokenizer.template
        token = self.turn_end.token
        everything = [*window, *new]
        cuts = [(len(window), False), (len(everything), True)]
        try:
            before, after = template.render_prefixes(
                everything, cuts, tools=prepared.tools, **prepared.kwargs
            )
        except RENDER_ERRORS:
            return None
        turns = before.count(token)
        if turns == 0 or (not before.rstrip().endswith(token) and not before.endswith(token)):
            return None
        position = -1
        for _ in range(turns):
            position = after.find(token, position + 1)
            if position < 0:
                return None
        return after[position + len(token) :]


def continues(previous: BuiltTurn, prepared: Prepared) -> tuple[int | None, str | None]:
    """(the choice of `previous` this request continues, None) or (None, why it does not): the same
    tools and template kwargs, the previous request's messages unchanged, one of its replies echoed
    back with the same meaning (`same_reply`), and at least one message after it."""
    if prepared.tools != previous.tools:
        return None, "the tools changed"
    if prepared.kwargs != previous.kwargs:
        return None, "the chat template kwargs changed"
    known = len(previous.messages)
    messages = prepared.messages
    if len(messages) <= known:
        return None, "the history is not longer than the previous turn's"
    for index, (now, before) in enumerate(zip(messages[:known], previous.messages, strict=False)):
        if not same_message(now, before):
            return None, f"message {index + 1} ({before.get('role')}) changed"
    echoed = messages[known]
    differences = [same_reply(echoed, reply) for reply in previous.replies]
    choice = next((n for n, difference in enumerate(differences) if difference is None), None)
    if choice is None:
        return None, f"the previous reply came back changed ({differences[0]})"
    if len(messages) == known + 1:
        return None, "no message follows the echoed reply"
    return choice, None


def same_reply(echoed: Mapping[str, Any], reply: Mapping[str, Any]) -> str | None:
    """None when `echoed` (the agent's copy of a reply) says what `reply` (the model's) said, else what
    differs. Whitespace around and within text, the key order and spacing of tool-call arguments, and
    reasoning the agent left out do not count; other text, other calls or other arguments do."""
    if echoed.get("role") != "assistant":
        return f"role {echoed.get('role')!r} where the reply was the assistant's"
    if _words(echoed.get("content")) != _words(reply.get("content")):
        return "its content"
    said, calls = _calls(echoed), _calls(reply)
    if said != calls:
        return (
            "its tool calls" if [n for n, _ in said] != [n for n, _ in calls] else "its tool-call arguments"
        )
    reasoning = next((echoed[f] for f in ("reasoning_content", "reasoning") if echoed.get(f)), None)
    if reasoning is not None and _words(reasoning) != _words(
        reply.get("reasoning_content") or reply.get("reasoning")
    ):
        return "its reasoning"
    return None


def study_turn_end(template: ChatTemplate, added_ids: Mapping[str, int]) -> TurnEnd:
    """The added token a template ends an assistant turn with, right after the reply's text (a user
    message, then a reply of a marker, rendered without a generation prompt); with the tokenizer's
    end-of-text tokens, the ids a generated turn may stop on. Raises ValueError when no added token
    follows the reply."""
    try:
        text = template.render(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _MARKER}],
            add_generation_prompt=False,
        )
    except RENDER_ERRORS as exc:
        raise ValueError(f"the chat template cannot render a reply: {exc}") from exc
    after = text[text.rfind(_MARKER) + len(_MARKER) :] if _MARKER in text else ""
    token = next((t for t in sorted(added_ids, key=len, reverse=True) if t and after.startswith(t)), None)
    if token is None:
        raise ValueError(
            f"the chat template ends an assistant turn with {after[:40]!r}, not an added token: "
            "`--tokens exact` cannot tell where a reply ends (use --tokens observe)"
        )
    specials = template.special_tokens
    ending = (token, specials.get("eos_token"), "<|endoftext|>")
    stops = {added_ids[t] for t in ending if t is not None and t in added_ids}
    return TurnEnd(token, added_ids[token], frozenset(stops))


def _words(value: Any) -> list[str]:
    if isinstance(value, list):
        value = " ".join(p.get("text", "") for p in value if isinstance(p, dict))
    return value.split() if isinstance(value, str) else []


def _calls(message: Mapping[str, Any]) -> list[tuple[Any, Any]]:
    out: list[tuple[Any, Any]] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            out.append((None, None))
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = " ".join(arguments.split())
        out.append((function.get("name"), arguments))
    return out
