"""Exact prompt counting: how many tokens the served model sees for a request body.

Owns: the counter a budget asks (TokenCounter): turning a request into the prompt the backend renders,
choosing between extending a counted conversation and a full render, and the sampled full
verification that switches the fast paths off. Does not own: what a format's prompt is
(modeltap.dialects), the engine's message preparation (compat/preparations.py, compat/prompts.py),
what is loaded from a tokenizer folder and shared per process (loaded.py), rendering (template.py),
the windows (windows.py), the pieces (segments.py), the cached conversations (conversations.py), the
limits (budget.py), nor running off the event loop (budget.py calls `count` through
`asyncio.to_thread`). No transformers: it is the tests' oracle only.

How a count is made (docs/token-budgets.md §5):
1. the prompt is prepared the way the served engine prepares it (its release's `Preparation`,
   compat/prompts.py: docs/engines.md §7); a conversation the engine rewrites as a whole (vLLM merging
   a developer message into the system message) is rendered in full;
2. a request that extends a conversation counted before (the same tools and kwargs, its earlier
   messages unchanged) renders only its new messages, in a window (windows.py), and counts
   only the text they add, from where the last count was cut (segments.py): its cost is what the
   turn adds, not the history (docs/token-budgets.md §5.4, "prefix reuse with a safe seam");
3. any other request is rendered in full and counted piece by piece between the added tokens, with a
   cache of piece counts; it leaves a conversation for the next turn to extend;
4. pieces are encoded by tiktoken built from the vocabulary where bpe.py proves its ids equal to the
   `tokenizers` library's, else by that library;
5. the first requests and one in 128 after are re-counted by a full render and a full encode; a
   mismatch switches counting by windows (or by pieces, when those disagree) off for good, with a
   warning.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modeltap.compat.preparations import UNKNOWN, Preparation, template_names_developer
from modeltap.compat.prompts import prepare_conversation, prepare_message, prepare_tools
from modeltap.counting.conversations import Conversation, ConversationCache
from modeltap.counting.loaded import SEGMENT_CACHE_MAX_CHARS, SHARED, LoadedTokenizer, resolve
from modeltap.counting.template import APPLY_CHAT_TEMPLATE_PARAMETERS
from modeltap.counting.windows import (
    HEAD_MAX,
    RENDER_ERRORS,
    Delta,
    Windows,
    context,
    generation_prompt,
    head_length,
    render_delta,
    shape,
)
from modeltap.dialects.base import TextPrompt
from modeltap.dialects.roles import Dialect

log = logging.getLogger(__name__)

# A full render and encode costs milliseconds per 10k tokens (docs/token-budgets.md §5.3): checking
# the first requests catches a template or tokenizer the fast paths cannot reproduce before it decides
# anything that matters, and one request in 128 after keeps checking at under 1% of the cost of
# counting every request in full. A check costs what the whole prompt does, so above 16k tokens the
# interval stretches with the prompt (one in 512 at 64k): the checks' share of a turn's cost stays the
# same however long the history grows.
VERIFY_FIRST_REQUESTS = 16
VERIFY_EVERY_REQUESTS = 128
VERIFY_SCALE_TOKENS = 16_384

# Conversations kept for their next turn, by rendered characters (each keeps its request's messages
# alive, about as large): 64 parallel agent sessions of 30k tokens, at ~4 characters a token.
CONVERSATIONS_MAX_CHARS = 8_000_000

# Template kwargs a request may not set: apply_chat_template would consume them, not pass them on.
_RESERVED_TEMPLATE_KWARGS = APPLY_CHAT_TEMPLATE_PARAMETERS | {"tools", "documents", "add_generation_prompt"}


def check_interval(prompt_tokens: int, every: int = VERIFY_EVERY_REQUESTS) -> float:
    """After how many requests one of `prompt_tokens` is checked: `every`, stretched above
    VERIFY_SCALE_TOKENS in proportion to the prompt."""
    return every * max(1.0, prompt_tokens / VERIFY_SCALE_TOKENS)


class CountError(ValueError):
    """The body cannot be rendered into a prompt (malformed messages, or the template refused them)."""


@dataclass(frozen=True, slots=True)
class Prepared:
    """A chat request as the engine prepares it before rendering: its messages normalised
    (compat/prompts.py), its tools, and the template kwargs in force (the configured, then the
    request's own)."""

    messages: tuple[dict[str, Any], ...]
    tools: list[Any] | None
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CounterStats:
    """What the counter has done so far, for `serve`'s status line, the benchmarks and the tests.

    `encoder` is "tiktoken" or "tokenizers"; `fast_path` says whether pieces are counted apart (with
    their cache) and `incremental` whether conversations are extended by windows: both turn off for
    good after a mismatch. `extended` counts the requests counted from a cached conversation.
    """

    requests: int
    extended: int
    cache_hits: int
    cache_misses: int
    verifications: int
    mismatches: int
    encoder: str
    fast_path: bool
    incremental: bool
    cached_chars: int
    conversations: int


class TokenCounter:
    """Counts a request's prompt tokens exactly as the served model does.

    >>> counter = TokenCounter.load("/models/qwen2.5", {"enable_thinking": False})
    >>> counter.count(dialects.named("chat"), {"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    13

    Thread-safe: `count` may run in several worker threads at once.
    """

    def __init__(
        self,
        tokenizer: LoadedTokenizer,
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        request_template_kwargs: bool = True,
        openai_typed_chat: bool = False,
        preparation: Preparation = UNKNOWN,
        verify_first: int = VERIFY_FIRST_REQUESTS,
        verify_every: int = VERIFY_EVERY_REQUESTS,
        conversations_max_chars: int = CONVERSATIONS_MAX_CHARS,
    ) -> None:
        """Use `load` unless the tokenizer is already loaded.

        `request_template_kwargs=False` ignores a request's own `chat_template_kwargs`: AReaL drops
        that field (docs/areal.md §1.1.6), so against AReaL only the configured kwargs
        describe what the server renders. `openai_typed_chat=True` counts a chat body as AReaL's
        proxy sees it after validating it against the openai SDK's types: message fields the types do
        not declare (such as `reasoning_content`) dropped, and tool definitions in the types' key
        order, which the template's `tojson` shows. Against AReaL, set both.

        `preparation` is how the served engine prepares messages and tools before its template
        (compat/preparations.py `preparation(engine, version)`); the default, UNKNOWN, is modeltap's guess
        for an engine it does not know.

        `verify_first` and `verify_every` (0: never) set which counts are checked by a full render
        and encode: the first ones, then one in `verify_every` (`check_interval`);
        `conversations_max_chars` bounds the conversations kept for their next turn.
        """
        self._tokenizer = tokenizer
        self._template_kwargs = dict(chat_template_kwargs or {})
        self._request_template_kwargs = request_template_kwargs
        self._openai_typed_chat = openai_typed_chat
        self._preparation = preparation
        self._names_developer = {
            name: template_names_developer(source) for name, source in tokenizer.template.templates.items()
        }
        self._verify_first, self._verify_every = verify_first, verify_every
        self._conversations = ConversationCache(conversations_max_chars)
        self._fast_path = tokenizer.segments is not None
        self._incremental = tokenizer.segments is not None and tokenizer.segments.splits
        self._lock = threading.Lock()
        self._requests = self._extended = self._verifications = self._mismatches = 0
        self._unchecked = 0  # requests since the last check

    @classmethod
    def load(
        cls,
        path_or_name: str | os.PathLike[str],
        chat_template_kwargs: dict[str, Any] | None = None,
        *,
        cache_max_chars: int = SEGMENT_CACHE_MAX_CHARS,
        **options: Any,
    ) -> TokenCounter:
        """A counter on a local tokenizer folder, or a model name already in the local Hugging Face
        cache, loaded once per process (SHARED). Never downloads. Raises ValueError naming the fix
        when there is no usable tokenizer there. `cache_max_chars` bounds the shared piece cache;
        `options` are the constructor's keyword arguments."""
        tokenizer = SHARED.get(resolve(path_or_name), cache_max_chars)
        counter = cls(tokenizer, chat_template_kwargs, **options)
        if counter._incremental:
            # The configured kwargs' proofs run at load, not on the first requests.
            for tools in (None, [{"type": "function"}]):
                tokenizer.stability.windows(counter._kwargs({}), tools)
        return counter

    @property
    def preparation(self) -> Preparation:
        """How the served engine prepares messages, as this counter counts them."""
        return self._preparation

    @property
    def tokenizer(self) -> LoadedTokenizer:
        """The loaded tokenizer this counter counts with (shared with the process's other counters)."""
        return self._tokenizer

    @property
    def stats(self) -> CounterStats:
        """A snapshot of the counters."""
        segments = self._tokenizer.segments
        with self._lock:
            return CounterStats(
                requests=self._requests,
                extended=self._extended,
                cache_hits=segments.hits if segments else 0,
                cache_misses=segments.misses if segments else 0,
                verifications=self._verifications,
                mismatches=self._mismatches,
                encoder=self._tokenizer.encoder,
                fast_path=self._fast_path,
                incremental=self._incremental,
                cached_chars=segments.cached_chars if segments else 0,
                conversations=len(self._conversations),
            )

    def count(self, dialect: Dialect, body: dict[str, Any]) -> int:
        """Prompt tokens of `body`, a request of `dialect`, as the served model counts them.

        Blocking (well under a millisecond for a turn of a known conversation, a full render and
        encode for a new one or a verification): call it off the event loop. Raises CountError when
        the body cannot be rendered.
        """
        try:
            prompt = dialect.prompt(body, openai_typed=self._openai_typed_chat)
            if isinstance(prompt, TextPrompt):
                return self._count_completion_prompt(prompt.prompt)
            request_kwargs = prompt.template_kwargs if self._request_template_kwargs else {}
            tools = prepare_tools(self._preparation, prompt.tools)
            return self._count_chat(list(prompt.messages), tools, self._kwargs(request_kwargs))
        except RENDER_ERRORS as exc:
            if isinstance(exc, CountError):
                raise
            raise CountError(f"cannot render the prompt of this {dialect.name} request: {exc}") from exc

    def normalised(self, message: Mapping[str, Any], tools: Sequence[Any] | None) -> dict[str, Any]:
        """One message as the engine prepares it for the template (compat/prompts.py), with `tools`
        deciding which of the model's templates renders it."""
        return self._normaliser(tools)(message)

    def prepared(self, dialect: Dialect, body: dict[str, Any]) -> Prepared:
        """`body`'s chat prompt as the engine prepares it before rendering (what `count` renders).
        Raises CountError for a body with no chat prompt (a completions prompt) or one that cannot be
        read."""
        try:
            prompt = dialect.prompt(body, openai_typed=self._openai_typed_chat)
            if isinstance(prompt, TextPrompt):
                raise CountError("a completions prompt has no chat messages to prepare")
            request_kwargs = prompt.template_kwargs if self._request_template_kwargs else {}
            normalise = self._normaliser(prompt.tools)
            messages = tuple(normalise(message) for message in prompt.messages)
        except RENDER_ERRORS as exc:
            if isinstance(exc, CountError):
                raise
            raise CountError(f"cannot read the prompt of this {dialect.name} request: {exc}") from exc
        return Prepared(messages, list(prompt.tools) if prompt.tools else None, self._kwargs(request_kwargs))

    def render(
        self, dialect: Dialect, body: dict[str, Any], reply: Mapping[str, Any] | None = None
    ) -> str | TextPrompt:
        """The text the served model's template makes of `body`'s prompt, rendered in full as a check
        renders it; with `reply` (the answer as an OpenAI chat assistant message), the conversation
        with the reply appended and no generation prompt. A completions prompt comes back as it is: no
        template renders it. For `serve --token-ids` where the server returns no ids
        (proxy/token_recorder.py encodes the text). Blocking; raises CountError as `count` does."""
        try:
            prompt = dialect.prompt(body, openai_typed=self._openai_typed_chat)
            if isinstance(prompt, TextPrompt):
                return prompt
            request_kwargs = prompt.template_kwargs if self._request_template_kwargs else {}
            messages = [*prompt.messages, reply] if reply is not None else list(prompt.messages)
            tools = prepare_tools(self._preparation, prompt.tools)
            return self._tokenizer.template.render(
                self._prepared(messages, tools),
                tools=tools,
                add_generation_prompt=reply is None,
                **self._kwargs(request_kwargs),
            )
        except RENDER_ERRORS as exc:
            if isinstance(exc, CountError):
                raise
            raise CountError(f"cannot render the prompt of this {dialect.name} request: {exc}") from exc

    # --- chat ---------------------------------------------------------------------------------------

    def _kwargs(self, request_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The template kwargs of a request: the configured ones, then the request's own."""
        kwargs = {**self._template_kwargs, **request_kwargs}
        return {k: v for k, v in kwargs.items() if k not in _RESERVED_TEMPLATE_KWARGS}

    def _count_chat(
        self, messages: list[Any], tools: Sequence[Mapping[str, Any]] | None, kwargs: dict[str, Any]
    ) -> int:
        normalise = self._normaliser(tools)
        answer: int | None = None
        text = None
        whole = self._preparation.whole(
            messages, self._names_developer[self._tokenizer.template.name_for(tools)]
        )
        windows = None if whole else self._windows(kwargs, tools)
        if windows is not None:
            base = self._conversations.find(messages, tools, kwargs)
            if base is not None:
                answer = self._extend(base, messages, tools, kwargs, windows, normalise)
        if answer is None:
            normalised = self._prepared(messages, tools)
            text = self._tokenizer.template.render(normalised, tools=tools, **kwargs)
            answer = self._count_rendered(text, messages, normalised, tools, kwargs, windows)
        if self._to_check(answer):
            return self._verified(answer, text, messages, tools, kwargs)
        return answer

    def _windows(self, kwargs: dict[str, Any], tools: Sequence[Mapping[str, Any]] | None) -> Windows | None:
        """How this request's conversation is counted by windows (windows.py), or None: not."""
        if not self._incremental:
            return None
        return self._tokenizer.stability.windows(kwargs, tools)

    def _extend(
        self,
        base: Conversation,
        messages: list[Any],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: dict[str, Any],
        windows: Windows,
        normalise: Callable[[Any], dict[str, Any]],
    ) -> int | None:
        """The count of `messages`, which extend `base`, from the new messages alone; None where the
        template rewrites something (then the caller renders in full)."""
        known = len(base.messages)
        if known == len(messages):
            self._count_extended()
            return base.prompt_tokens
        normalised = {i: normalise(messages[i]) for i in range(min(known, HEAD_MAX))}
        head = head_length(list(normalised.values()))
        for index in context(known, head, base.rewritable):
            if index not in normalised:
                normalised[index] = normalise(messages[index])
        window = [normalised[index] for index in context(known, head, base.rewritable)]
        new = [normalise(message) for message in messages[known:]]
        added = render_delta(self._tokenizer.template, window, new, tools, kwargs, windows.prompt)
        segments = self._tokenizer.segments
        if added is None or segments is None:
            return None
        if not _ends_on_assistant(new):
            answer = self._keep_extended(base, messages, new, added, windows)
            self._count_extended()
            return answer
        # A request ending on the assistant (a prefill, a continuation, a replayed history) is kept
        # without that message, which templates render apart while it is last (Qwen3 gives it an empty
        # think block): the next request, which follows it with more, extends what stays as it is.
        history = base.tail + added.text
        total, _, _ = segments.count_resumable(history + added.prompt, len(history))
        kept = new[:-1]
        extension = (
            render_delta(self._tokenizer.template, window, kept, tools, kwargs, windows.prompt)
            if kept
            else None
        )
        if extension is not None:
            self._keep_extended(base, messages[: known + len(kept)], kept, extension, windows)
        self._count_extended()
        return base.counted + total

    def _keep_extended(
        self,
        base: Conversation,
        messages: list[Any],
        new: list[dict[str, Any]],
        added: Delta,
        windows: Windows,
    ) -> int:
        """Cache `messages`, which extend `base` by `new` (normalised), rendered as `added`; return
        their count."""
        segments = self._tokenizer.segments
        assert segments is not None  # only windows extend, and they count by pieces
        history = base.tail + added.text
        total, cut, before = segments.count_resumable(history + added.prompt, len(history))
        known = len(base.messages)
        kept = windows.rewritten
        rewritable = (*base.rewritable, *(known + i for i, m in enumerate(new) if shape(m) in kept))
        extended = Conversation(
            # The cached objects, not this request's equal ones: dropping `base` then frees nothing
            # but a list, where holding this request's would free every earlier message of the last
            # request here, in the count (a cost growing with the history); this request's copies go
            # with its body, as they would without a budget.
            messages=[*base.messages, *messages[len(base.messages) :]],
            tools=base.tools,
            kwargs=base.kwargs,
            counted=base.counted + before,
            tail=history[cut:],
            prompt_tokens=base.counted + total,
            rewritable=rewritable,
            chars=base.chars + len(added.text),
        )
        self._conversations.store(extended, replacing=base)
        return base.counted + total

    def _count_rendered(
        self,
        text: str,
        messages: list[Any],
        normalised: list[dict[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: dict[str, Any],
        windows: Windows | None,
    ) -> int:
        """The count of a full render, leaving a conversation for the next turn where windows apply."""
        segments = self._tokenizer.segments
        if segments is None or not self._fast_path:
            return self._tokenizer.reference_count(text)
        if windows is None:
            return segments.count(text)
        if _ends_on_assistant(normalised) and len(normalised) > 1:
            # Kept without its last message, which the next request follows with more (`_extend`).
            self._keep_rendered(messages[:-1], normalised[:-1], None, tools, kwargs, windows)
            return segments.count(text)
        return self._keep_rendered(messages, normalised, text, tools, kwargs, windows)

    def _keep_rendered(
        self,
        messages: list[Any],
        normalised: list[dict[str, Any]],
        text: str | None,
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: dict[str, Any],
        windows: Windows,
    ) -> int:
        """Cache `messages`, rendered in full as `text` (None: rendered here), for the next request to
        extend; return its count."""
        segments = self._tokenizer.segments
        assert segments is not None  # the caller counts by pieces
        template = self._tokenizer.template
        if text is None:
            text = template.render(normalised, tools=tools, **kwargs)
        head = head_length(normalised)
        rewritable = tuple(
            i for i in range(head, len(normalised)) if shape(normalised[i]) in windows.rewritten
        )
        window = [normalised[i] for i in context(len(normalised), head, rewritable)]
        prompt = windows.prompt
        if prompt is None:
            prompt = generation_prompt(template, window, tools, kwargs)
        if prompt is None or not text.endswith(prompt):
            return segments.count(text)
        stable = len(text) - len(prompt)
        total, cut, before = segments.count_resumable(text, stable)
        counted = Conversation(
            messages=messages,
            tools=tools,
            kwargs=kwargs,
            counted=before,
            tail=text[cut:stable],
            prompt_tokens=total,
            rewritable=rewritable,
            chars=stable,
        )
        self._conversations.store(counted)
        return total

    def _normaliser(self, tools: Sequence[Mapping[str, Any]] | None) -> Callable[[Any], dict[str, Any]]:
        """One message as the engine prepares it, for the windows (which never hold a conversation
        the engine rewrites as a whole)."""
        string_content = self._tokenizer.string_content[self._tokenizer.template.name_for(tools)]
        return functools.partial(prepare_message, self._preparation, string_content=string_content)

    def _prepared(
        self, messages: Sequence[Any], tools: Sequence[Mapping[str, Any]] | None
    ) -> list[dict[str, Any]]:
        """The whole conversation as the engine prepares it."""
        name = self._tokenizer.template.name_for(tools)
        return prepare_conversation(
            self._preparation,
            messages,
            string_content=self._tokenizer.string_content[name],
            names_developer=self._names_developer[name],
        )

    # --- completions --------------------------------------------------------------------------------

    def _count_completion_prompt(self, prompt: Any) -> int:
        """Legacy completions: the prompt is text or token ids, or a batch of either; a batch is
        budgeted by its longest prompt."""
        if isinstance(prompt, str):
            # Servers encode a completions prompt with the tokenizer's special tokens (BOS).
            tokenizer = self._tokenizer
            segments = tokenizer.segments if self._fast_path else None
            count = segments.count(prompt) if segments is not None else tokenizer.reference_count(prompt)
            if self._to_check(count):
                count = self._checked(count, prompt)
            return count + tokenizer.special_tokens_added
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if isinstance(prompt, list) and prompt:
            return max(self._count_completion_prompt(p) for p in prompt)
        raise CountError("a completions prompt must be text, token ids, or a list of either")

    # --- verification -------------------------------------------------------------------------------

    def _to_check(self, tokens: int) -> bool:
        """Count one request of `tokens` prompt tokens; whether to check it by a full render and encode."""
        with self._lock:
            self._requests += 1
            self._unchecked += 1
            due = self._requests <= self._verify_first or (
                self._verify_every > 0 and self._unchecked >= check_interval(tokens, self._verify_every)
            )
            if due:
                self._unchecked = 0
            return due

    def _count_extended(self) -> None:
        with self._lock:
            self._extended += 1

    def _verified(
        self,
        answer: int,
        text: str | None,
        messages: list[Any],
        tools: Sequence[Mapping[str, Any]] | None,
        kwargs: dict[str, Any],
    ) -> int:
        """The full render's and encode's count of a chat prompt, checked against `answer`."""
        if text is None:
            try:
                normalised = self._prepared(messages, tools)
                text = self._tokenizer.template.render(normalised, tools=tools, **kwargs)
            except RENDER_ERRORS:
                # Counted by windows though transformers could not render it: the windows are wrong.
                self._switch_off(answer, None, incremental_only=True)
                raise
        return self._checked(answer, text)

    def _checked(self, answer: int, text: str) -> int:
        """The full encode's count of `text`; a different `answer` switches a fast path off for good."""
        truth = self._tokenizer.reference_count(text)
        with self._lock:
            self._verifications += 1
        if truth == answer:
            return truth
        segments = self._tokenizer.segments
        pieces_agree = segments is not None and self._fast_path and segments.count(text) == truth
        self._switch_off(answer, truth, incremental_only=pieces_agree)
        return truth

    def _switch_off(self, answer: int, truth: int | None, incremental_only: bool) -> None:
        with self._lock:
            self._mismatches += 1
            was_incremental, was_fast = self._incremental, self._fast_path
            self._incremental = False
            if not incremental_only:
                self._fast_path = False
        self._conversations.clear()
        truth_text = "cannot render it" if truth is None else f"counts {truth}"
        if incremental_only and was_incremental:
            log.warning(
                "token count mismatch: counting only the new messages gave %d tokens where a full render "
                "and encode %s; rendering every request in full from now on",
                answer,
                truth_text,
            )
        elif was_fast:
            log.warning(
                "token count mismatch: the %s segment cache counted %d tokens where a full encode %s; "
                "counting by full encode from now on",
                self._tokenizer.encoder,
                answer,
                truth_text,
            )


def _ends_on_assistant(messages: Sequence[Mapping[str, Any]]) -> bool:
    return bool(messages) and messages[-1].get("role") == "assistant"
