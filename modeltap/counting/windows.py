"""What a conversation's new messages add to its rendered prompt, rendered without its whole history.

Owns: the windowed render (the conversation's head, the earlier messages the template may still
rewrite, the last few messages, then the new ones), the check that the render before the new messages
is a prefix of the render after them, and the one-time proof, per template and template kwargs, that
windowed renders give what full renders give. Does not own: counting the text (segments.py), the
cache of conversations (conversations.py), or when to render in full instead (counter.py).

Why a window is enough, and where it is not. Templates render each message from the message itself,
its neighbours (Qwen groups consecutive tool results, and renders the last message apart), and a few
things about the whole conversation: the first system and user messages (Llama 3 moves the tools into
the first user turn) and, in Qwen3-style templates, which user message is the last query, before
which assistant turns lose their reasoning. So a window holds the head (through the first user
message), the last OVERLAP messages, and every earlier message of a shape the template has been seen
to rewrite when more messages follow. Which shapes those are is found at load by rendering synthetic
conversations in full and windowed (`AppendStability`); the same renders then check every window on
longer conversations, and a template that fails them is counted by full render. A dependence no
synthetic conversation shows is what the counter's sampled full verification is for.

    windows = AppendStability(template).windows(kwargs, tools)   # None: never count this template by windows
    added = render_delta(template, context, new, tools, kwargs, windows.prompt)  # None: render in full
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jinja2

from modeltap.counting.template import REASONING_FIELDS, ChatTemplate

# The last messages before the new ones rendered again with them: templates look one message back
# (Qwen opens a run of tool results once) and one ahead (the last message is rendered apart).
OVERLAP = 2
# The head is the conversation through its first user message, and at most this many messages.
HEAD_MAX = 4
# Proofs kept per template: one per template-kwargs set and kind of tool list; requests bring few.
PROOFS_MAX = 64

# What templates branch on when they rewrite an earlier message: its role, whether it carries
# reasoning (a field, or <think> in its text, which Qwen3-style templates split out), tool calls.
Shape = tuple[str, bool, bool]
_THINK_TAGS = ("<think>", "</think>")

# A render fails in a template's own words (raise_exception) or on input it cannot handle; a body nested
# deeper than the template (or the copy of its data) can walk raises RecursionError, and passes uncounted.
RENDER_ERRORS = (
    jinja2.TemplateError,
    TypeError,
    ValueError,
    KeyError,
    AttributeError,
    IndexError,
    RecursionError,
)


class Delta(NamedTuple):
    """What new messages add to a render without the generation prompt, and the generation prompt."""

    text: str
    prompt: str


def shape(message: Mapping[str, Any]) -> Shape:
    """The features of a (normalised) message a template may rewrite it by."""
    content = message.get("content")
    texts: list[Any] = [content] if isinstance(content, str) else []
    if isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
    reasoning = any(message.get(field) for field in REASONING_FIELDS) or any(
        isinstance(text, str) and tag in text for text in texts for tag in _THINK_TAGS
    )
    return str(message.get("role")), reasoning, bool(message.get("tool_calls"))


def head_length(messages: Sequence[Mapping[str, Any]]) -> int:
    """How many leading messages form the head: through the first user message (at most HEAD_MAX)."""
    for index, message in enumerate(messages[:HEAD_MAX]):
        if message.get("role") == "user":
            return index + 1
    return min(1, len(messages))


def context(length: int, head: int, rewritable: Sequence[int]) -> list[int]:
    """The indexes a window of the first `length` messages holds: the head, the rewritable messages
    before the last OVERLAP, and the last OVERLAP."""
    start = max(head, length - OVERLAP)
    return [*range(head), *(i for i in rewritable if head <= i < start), *range(start, length)]


def render_delta(
    template: ChatTemplate,
    before: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
    prompt: str | None = None,
) -> Delta | None:
    """What `new` adds after the window `before`, or None when the render of `before` is not a prefix
    of the render with `new` (the template rewrites something) or a render fails.

    With `prompt`, the generation prompt proven the same after every conversation (`Windows`), the
    render of `before` and the prompted render with `new` suffice; else a third render, without the
    generation prompt, tells where it starts."""
    everything = [*before, *new]
    cuts = [(len(before), False), (len(everything), False), (len(everything), True)]
    if prompt is not None:
        del cuts[1]
    try:
        renders = template.render_prefixes(everything, cuts, tools=tools, **kwargs)
    except RENDER_ERRORS:
        return None
    earlier, prompted = renders[0], renders[-1]
    later = renders[1] if prompt is None else prompted[: len(prompted) - len(prompt)]
    if prompt is not None and not prompted.endswith(prompt):
        return None
    if not later.startswith(earlier) or not prompted.startswith(later):
        return None
    return Delta(later[len(earlier) :], prompted[len(later) :])


def generation_prompt(
    template: ChatTemplate,
    window: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> str | None:
    """What `add_generation_prompt` adds after the window, or None when it changes what comes before."""
    cuts = [(len(window), False), (len(window), True)]
    try:
        bare, prompted = template.render_prefixes(window, cuts, tools=tools, **kwargs)
    except RENDER_ERRORS:
        return None
    return prompted[len(bare) :] if prompted.startswith(bare) else None


@dataclass(frozen=True, slots=True)
class Windows:
    """How one template is counted by windows, for one template-kwargs set and kind of tool list:
    the shapes of earlier messages every window keeps (the template rewrites them when more messages
    follow), and the generation prompt when it is the same after every conversation (then a window
    takes two renders, not three)."""

    rewritten: frozenset[Shape]
    prompt: str | None


class AppendStability:
    """The one-time proof, per template kwargs and kind of tool list, of how a template can be
    counted by windows (`Windows`), or None when windows do not reproduce its full renders.
    Thread-safe; computed on first use of each key and kept (at most PROOFS_MAX keys; beyond,
    windows are not used)."""

    def __init__(self, template: ChatTemplate) -> None:
        self._template = template
        self._proofs: dict[tuple[str, str], Windows | None] = {}
        self._lock = threading.Lock()

    def windows(self, kwargs: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None) -> Windows | None:
        """How to count by windows with these kwargs and tools, or None: count by full render."""
        kind = "none" if tools is None else "some" if tools else "empty"
        key = (json.dumps(kwargs, sort_keys=True, default=repr), kind)
        with self._lock:
            if key in self._proofs:
                return self._proofs[key]
            if len(self._proofs) >= PROOFS_MAX:
                return None
        proof = _Proof(self._template, kwargs, None if tools is None else _SYNTHETIC_TOOLS[: len(tools)])
        windows = proof.windows()
        with self._lock:
            self._proofs[key] = windows
        return windows


class _Proof:
    """Synthetic conversations rendered in full and by windows, for one kwargs set and tool list."""

    def __init__(
        self, template: ChatTemplate, kwargs: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] | None
    ) -> None:
        self._template, self._kwargs, self._tools = template, kwargs, tools
        # Full renders by the synthetic messages they hold (alive for the proof, so ids are stable).
        self._renders: dict[tuple[tuple[int, ...], bool], str | None] = {}

    def windows(self) -> Windows | None:
        rewritten = frozenset(
            shape(message)
            for message in _CATALOGUE
            if any(not self._agrees(head, [message, *filler], new, ()) for head, filler, new in _PROBES)
        )
        if rewritten >= {shape(message) for message in _CATALOGUE}:
            return None  # every message would be in every window: a full render is cheaper
        shown = [self._prompt_of(conversation[:n]) for conversation in _CONVERSATIONS for n in range(1, 20)]
        prompts = {prompt for rendered, prompt in shown if rendered}
        constant = prompts.pop() if len(prompts) == 1 else None
        for prompt in dict.fromkeys([constant, None]):
            candidate = Windows(rewritten, prompt)
            if all(self._windows_agree(conversation, candidate) for conversation in _CONVERSATIONS):
                return candidate
        return None

    def _windows_agree(self, conversation: list[dict[str, Any]], windows: Windows) -> bool:
        """Every split of `conversation` into a history and one to three new messages, and every
        history's generation prompt, comes out of its window as out of the full render."""
        head = head_length(conversation)
        kept = [i for i in range(head, len(conversation)) if shape(conversation[i]) in windows.rewritten]
        for length in range(head, len(conversation) + 1):
            window = [conversation[i] for i in context(length, head, kept)]
            claimed = windows.prompt
            if claimed is None:
                claimed = generation_prompt(self._template, window, self._tools, self._kwargs)
            rendered, truth = self._prompt_of(conversation[:length])
            if claimed is not None and rendered and claimed != truth:
                return False
            for added in (1, 2, 3):
                if length + added > len(conversation):
                    break
                new = conversation[length : length + added]
                if not self._agrees(
                    conversation[:head], conversation[head:length], new, kept, windows.prompt
                ):
                    return False
        return True

    def _agrees(
        self,
        head: Sequence[dict[str, Any]],
        middle: Sequence[dict[str, Any]],
        new: Sequence[dict[str, Any]],
        kept: Sequence[int],
        prompt: str | None = None,
    ) -> bool:
        """Whether the window's delta is the full renders' whenever the window claims one."""
        history = [*head, *middle]
        window = [history[i] for i in context(len(history), len(head), kept)]
        claimed = render_delta(self._template, window, new, self._tools, self._kwargs, prompt)
        earlier = self._full(history, False)
        if claimed is None or earlier is None:
            return True  # the counter renders in full, or never had this history to extend
        later, prompted = self._full([*history, *new], False), self._full([*history, *new], True)
        if later is None or prompted is None:
            return False  # the window counts what transformers refuses to render
        truth = Delta(later[len(earlier) :], prompted[len(later) :])
        return later.startswith(earlier) and prompted.startswith(later) and claimed == truth

    def _prompt_of(self, messages: Sequence[dict[str, Any]]) -> tuple[bool, str | None]:
        """(whether transformers renders `messages`, the generation prompt its renders show: None
        where the prompted render changes what comes before it)."""
        bare, prompted = self._full(messages, False), self._full(messages, True)
        if bare is None or prompted is None:
            return False, None
        return True, prompted[len(bare) :] if prompted.startswith(bare) else None

    def _full(self, messages: Sequence[dict[str, Any]], prompt: bool) -> str | None:
        key = (tuple(map(id, messages)), prompt)
        if key not in self._renders:
            try:
                self._renders[key] = self._template.render(
                    messages, tools=self._tools, add_generation_prompt=prompt, **self._kwargs
                )
            except RENDER_ERRORS:
                self._renders[key] = None
        return self._renders[key]


# --- the synthetic conversations -----------------------------------------------------------------


def _call(n: int) -> dict[str, Any]:
    return {
        "type": "function",
        "id": f"call_{n}",
        "function": {"name": "read", "arguments": {"path": f"f{n}.py"}},
    }


def _system(n: int) -> dict[str, Any]:
    return {"role": "system", "content": f"System note {n}."}


def _user(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Question {n}: what does f{n}.py do?"}


def _assistant(n: int, reasoning: str | None = None, calls: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": f"Answer {n}."}
    if reasoning == "field":
        message["reasoning_content"] = f"Thinking about {n}."
    elif reasoning == "tags":
        message["content"] = f"<think>\nThinking about {n}.\n</think>\n\nAnswer {n}."
    if calls:
        message["tool_calls"] = [_call(n)]
    return message


def _tool(n: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"call_{n}", "content": f"contents of f{n}.py"}


_SYNTHETIC_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read", "write", "grep")
]

# One message of every shape (the reasoning ones both ways they arrive), each placed before two
# messages of history and followed by each probe: a shape whose render a probe changes is rewritten.
_CATALOGUE = [
    _system(9),
    _user(9),
    _tool(9),
    _assistant(9),
    _assistant(9, calls=True),
    _assistant(9, "field"),
    _assistant(9, "tags"),
    _assistant(9, "field", calls=True),
    _assistant(9, "tags", calls=True),
]
_HEADS = ([{"role": "system", "content": "You are an agent."}, _user(0)], [_user(0)])
_FILLERS = ([_user(1), _assistant(1)], [_assistant(1, calls=True), _tool(1)], [_tool(1), _assistant(1)])
_NEW = ([_user(2)], [_assistant(2)], [_assistant(2, calls=True), _tool(2)], [_tool(2)], [_system(2)])
_PROBES = [(head, filler, new) for head in _HEADS for filler in _FILLERS for new in _NEW]

# Longer conversations mixing every shape, with and without a system message, where every split is
# checked with the rewritten shapes kept.
_AGENT_TURNS = [
    _assistant(1, calls=True),
    _tool(1),
    _assistant(2, "field", calls=True),
    _tool(2),
    _tool(3),
    _assistant(4),
    _user(5),
    _assistant(6, "tags", calls=True),
    _tool(6),
    _system(7),
    _assistant(8, "field"),
    _user(9),
    _assistant(10, calls=True),
    _tool(10),
    _assistant(11),
]
_CONVERSATIONS = [[*head, *_AGENT_TURNS] for head in _HEADS]
