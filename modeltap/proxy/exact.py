"""`serve --tokens exact`: token-in, token-out. modeltap builds each chat request's prompt ids itself,
sends them to the engine's token endpoint, and turns the generated ids back into the client's message,
so the ids a trainer trains on are the ids the model saw and produced.

Owns: the mode's state (`ExactMode`: the prompt builder, the reply parsers, the engine's endpoint,
each session's recent turns), and one exchange through it (`ExactTranslation`): the engine request
(the sampling the chat request asked for, its cap after the budget), the chat answer made of the
engine's answer (`reply`) or stream (`stream`: content as the ids arrive, each tool call once it is
complete), the ids for the record, and the turn kept for the next request to continue. Chat is the
format it translates from: a Messages or Responses client comes through the chat translation first
(translate.py), so every format gets exact ids. Does not own: building the ids (counting/continuation.py),
parsing the generated text (compat/parsers), the engines' request shapes (compat/token_requests.py)
or answer shapes (dialects/openai_completions.py, dialects/sglang_generate.py), or HTTP (relay.py,
answers.py).

    exact = ExactMode(counter, engine, reply_parser("hermes", "qwen3"), context_length=32768)
    translation = await exact.start(session_id, chat_body)      # the ids, built off the event loop
    payload = translation.payload(max_tokens)                    # to translation.endpoint at .path
    chat = translation.reply(engine_answer)                      # or: tap = translation.stream()
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from modeltap.compat.engines import EngineInfo
from modeltap.compat.parsers import (
    ParsedCall,
    ParsedReply,
    ReplyContext,
    ReplyParser,
    ReplyStream,
    StreamStep,
    ToolSpec,
)
from modeltap.compat.token_requests import Sampling, sglang_generate, vllm_completions
from modeltap.counting.continuation import BuiltPrompt, BuiltTurn, PromptBuilder
from modeltap.counting.counter import CountError, TokenCounter
from modeltap.dialects import openai_completions
from modeltap.dialects import sglang_generate as generate_dialect
from modeltap.dialects.openai_chat import DIALECT as CHAT
from modeltap.dialects.roles import TokenEndpoint
from modeltap.dialects.sse import DONE_EVENT, Assembled, StreamAssembler, data_event
from modeltap.dialects.token_ids import Generated, TokenIds
from modeltap.proxy.errors import BadRequest

# Turns kept per session: the main thread's last, and a few side requests an agent interleaves with
# it (opencode's title, a compaction) that must not push the main turn out.
TURNS_PER_SESSION = 4
# Ids kept across every session's turns, at 4 bytes each (array "I"): 64 sessions of 8 turns of 60k
# ids. The least recently continued session goes first.
TURN_MEMORY_MAX_IDS = 32_000_000
# Ids of a prompt's end decoded for its parsers: enough for the last turn's opening (a generation
# prompt, with Qwen3's `<think>\n\n</think>` when thinking is off), which is all they read.
PROMPT_TAIL_IDS = 512
# Random bits of the ids modeltap gives a completion and its tool calls (OpenAI's are 24 hex digits).
_ID_BITS = 96


@dataclass(slots=True)
class _Session:
    turns: collections.deque[BuiltTurn] = field(
        default_factory=lambda: collections.deque(maxlen=TURNS_PER_SESSION)
    )
    ids: int = 0


class TurnMemory:
    """Each session's recent turns, the newest first, bounded by the ids they hold (TURN_MEMORY_MAX_IDS).
    Owned by the proxy; used on the event loop only."""

    def __init__(self, max_ids: int = TURN_MEMORY_MAX_IDS) -> None:
        self._max_ids = max_ids
        self._sessions: collections.OrderedDict[str, _Session] = collections.OrderedDict()
        self._ids = 0

    def recent(self, session: str | None) -> list[BuiltTurn]:
        """The session's turns, newest first."""
        kept = self._sessions.get(session) if session is not None else None
        return list(reversed(kept.turns)) if kept is not None else []

    def keep(self, session: str | None, turn: BuiltTurn) -> None:
        if session is None:
            return
        kept = self._sessions.setdefault(session, _Session())
        self._sessions.move_to_end(session)
        if len(kept.turns) == kept.turns.maxlen:
            self._forget(kept, kept.turns[0])
        kept.turns.append(turn)
        size = len(turn.prompt) + sum(len(c) for c in turn.completions)
        kept.ids += size
        self._ids += size
        while self._ids > self._max_ids and len(self._sessions) > 1:
            _, oldest = self._sessions.popitem(last=False)
            self._ids -= oldest.ids

    def _forget(self, kept: _Session, turn: BuiltTurn) -> None:
        size = len(turn.prompt) + sum(len(c) for c in turn.completions)
        kept.ids -= size
        self._ids -= size


class ExactMode:
    """The proxy's token-in, token-out state: one per proxy. `engine` says which token endpoint the
    upstream has (vLLM `/v1/completions`, SGLang `/generate`); `context_length` bounds a completion a
    request names no cap for (the chat route's meaning: up to the window's remainder)."""

    def __init__(
        self, counter: TokenCounter, engine: EngineInfo, parser: ReplyParser, context_length: int
    ) -> None:
        if engine.name not in ("vllm", "sglang"):
            raise ValueError(
                "`--tokens exact` needs an engine that takes token ids (vLLM or SGLang), not "
                f"{engine.describe()}: say which with --engine"
            )
        self.builder = PromptBuilder(counter)
        self.counter = counter
        self.engine = engine
        self.parser = parser
        loaded = counter.tokenizer
        self.special_tokens = loaded.special_tokens
        self.special_ids = frozenset(
            loaded.added_ids[t] for t in loaded.special_tokens if t in loaded.added_ids
        )
        self.context_length = context_length
        self.memory = TurnMemory()
        self.endpoint: TokenEndpoint = (
            openai_completions.DIALECT if engine.name == "vllm" else generate_dialect.DIALECT
        )
        # From the server's root: vLLM's OpenAI routes are under /v1, SGLang's native one is not.
        self.path = "/v1/completions" if engine.name == "vllm" else "/generate"

    async def start(self, session: str | None, chat_body: dict[str, Any]) -> ExactTranslation:
        """The translation of one chat request: its prompt ids built off the event loop, continuing
        the session's most recent turn it continues. Raises BadRequest for a body the template cannot
        render."""
        turns = self.memory.recent(session)
        try:
            built, context = await asyncio.to_thread(self._build, chat_body, turns)
        except CountError as exc:
            raise BadRequest(str(exc)) from None
        return ExactTranslation(self, session, chat_body, built, context)

    def _build(self, body: dict[str, Any], turns: list[BuiltTurn]) -> tuple[BuiltPrompt, ReplyContext]:
        """Blocking: the request's ids, and what the parsers read of it."""
        built = self.builder.build(CHAT, body, turns)
        return built, self.reply_context(body, built.ids)

    def reply_context(self, body: dict[str, Any], prompt: Sequence[int]) -> ReplyContext:
        """What the parsers read of a chat request and its prompt ids. `tool_choice` "required" or a
        named function is parsed as "auto": the engine's token endpoint applies no guided decoding
        (docs/parsers.md)."""
        tools = body.get("tools")
        kwargs = body.get("chat_template_kwargs")
        tail = self.text(prompt[-PROMPT_TAIL_IDS:])
        return ReplyContext(
            tools=ToolSpec.from_chat(tools if isinstance(tools, list) else None),
            tool_choice="none" if body.get("tool_choice") == "none" else "auto",
            parallel_tool_calls=body.get("parallel_tool_calls") is not False,
            chat_template_kwargs=kwargs if isinstance(kwargs, dict) else {},
            prompt_closes_reasoning=self.parser.prompt_closes_reasoning(tail),
            special_tokens=self.special_tokens,
        )

    def skipped(self, context: ReplyContext) -> frozenset[int]:
        """The ids left out of a reply's text, as vLLM detokenizes it: the stop id that ended it, and
        the special tokens unless the parsers want to see them (`skip_special_tokens`: docs/parsers.md)."""
        stops = self.builder.turn_end.stop_ids
        return stops | self.special_ids if self.parser.skip_special_tokens(context) else stops

    def text(self, ids: Sequence[int], skipped: frozenset[int] = frozenset()) -> str:
        """The text of ids, less the `skipped` ones."""
        token_bytes = self.counter.tokenizer.token_bytes
        assert token_bytes is not None  # the builder refuses a tokenizer without it
        return b"".join(token_bytes(i) for i in ids if i not in skipped).decode("utf-8", "replace")


class ExactTranslation:
    """One chat request through the engine's token endpoint. After `payload`, either `reply` (a whole
    answer) or `stream()` (a stream); `token_ids` then holds the ids for the record, and `remember`
    keeps the turn for the next request."""

    def __init__(
        self,
        mode: ExactMode,
        session: str | None,
        chat_body: dict[str, Any],
        built: BuiltPrompt,
        context: ReplyContext,
    ) -> None:
        self.mode = mode
        self.context = context
        self.skipped = mode.skipped(context)
        self.session = session
        self.chat_body = chat_body
        self.built = built
        self.endpoint = mode.endpoint
        self.path = mode.path
        self.request: dict[str, Any] = {}
        self.token_ids: TokenIds | None = None
        self.token_bytes = mode.counter.tokenizer.token_bytes
        self.chat_id = "chatcmpl-" + f"{random.getrandbits(_ID_BITS):024x}"
        self.created = int(time.time())
        self._generated: list[Generated] = []
        self._parsed: list[ParsedReply] = []

    @property
    def streamed(self) -> bool:
        """Whether the client asked for a stream."""
        return self.chat_body.get("stream") is True

    @property
    def how(self) -> str:
        """What the record says of the ids (`token_ask`): continued from the previous turn, or rendered
        in full and why."""
        if self.built.continued is not None:
            return f"built: continues the previous turn's {self.built.shared} ids"
        return f"built: rendered in full ({self.built.reason})"

    def payload(self, max_tokens: int | None) -> bytes:
        """The engine request: the ids, and the chat request's sampling with `max_tokens` (the cap after
        the budget; None: the window's remainder, as the chat route means it)."""
        room = self.mode.context_length - 1 - len(self.built.ids)
        cap = max(min(max_tokens, room) if max_tokens is not None else room, 1)
        sampling = Sampling.of_chat(self.chat_body, max_tokens=cap)
        # Asked as the chat route would detokenize: the engine's text then matches the one parsed here.
        skip = self.mode.parser.skip_special_tokens(self.context)
        if self.endpoint is openai_completions.DIALECT:
            model = self.chat_body.get("model")
            name = model if isinstance(model, str) else ""
            self.request = vllm_completions(
                name, self.built.ids, sampling, stream=self.streamed, skip_special_tokens=skip
            )
        else:
            self.request = sglang_generate(
                self.built.ids, sampling, stream=self.streamed, skip_special_tokens=skip
            )
        return json.dumps(self.request).encode()

    @property
    def recorded_request(self) -> dict[str, Any]:
        """The engine request as the record keeps it: the prompt ids are the exchange's token ids
        (records/token_store.py), not stored again here."""
        key = "prompt" if "prompt" in self.request else "input_ids"
        return {**self.request, key: f"<{len(self.built.ids)} token ids>"}

    def recorded_answer(self, answer: Any) -> Any:
        """The engine's answer as the record keeps it: its generated ids are the exchange's token ids,
        not stored again here."""
        if isinstance(answer, list):
            return [self.recorded_answer(one) for one in answer]
        if not isinstance(answer, dict):
            return answer
        out = dict(answer)
        for key in ("prompt_token_ids", "output_ids"):
            if isinstance(out.get(key), list):
                out[key] = f"<{len(out[key])} token ids>"
        if isinstance(out.get("choices"), list):
            out["choices"] = [self.recorded_answer(choice) for choice in out["choices"]]
        if isinstance(out.get("token_ids"), list):
            out["token_ids"] = f"<{len(out['token_ids'])} token ids>"
        return out

    # -- a whole answer -----------------------------------------------------------------------------------

    def reply(self, answer: Any) -> dict[str, Any]:
        """The chat completion the engine's whole answer amounts to."""
        generated = sorted(self.endpoint.generated(answer, streamed=False), key=lambda g: g.index)
        if not generated:
            raise ValueError("the engine's answer holds no generated token ids")
        parsed = [
            self.mode.parser.parse(self.mode.text(g.ids, self.skipped), self.context) for g in generated
        ]
        self.settle(generated, parsed)
        return self.completion(generated, parsed)

    def settle(self, generated: Sequence[Generated], parsed: Sequence[ParsedReply]) -> None:
        first = generated[0]
        self.token_ids = TokenIds(
            self.built.ids, first.ids, first.logprobs, "built", weight_version=first.weight_version
        )
        self._generated, self._parsed = list(generated), list(parsed)

    def remember(self) -> None:
        """Keep this turn for the session's next request to continue (after a complete answer)."""
        if self.token_ids is None:
            return
        self.mode.memory.keep(
            self.session,
            self.mode.builder.turn(
                self.built,
                [g.ids for g in self._generated],
                [self._message(p) for p in self._parsed],
            ),
        )

    def _message(self, parsed: ParsedReply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.reasoning is not None:
            message["reasoning_content"] = parsed.reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [self.call(call) for call in parsed.tool_calls]
        return message

    def call(self, call: ParsedCall) -> dict[str, Any]:
        """A parsed tool call as chat carries it, with an id of its own."""
        number = f"{random.getrandbits(_ID_BITS):024x}"
        return {
            "id": f"call_{number}",
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }

    def completion(self, generated: Sequence[Generated], parsed: Sequence[ParsedReply]) -> dict[str, Any]:
        choices = [
            {
                "index": g.index,
                "message": self._message(p),
                "logprobs": self._logprobs(g),
                "finish_reason": p.finish_reason(g.finish_reason),
            }
            for g, p in zip(generated, parsed, strict=True)
        ]
        completion_tokens = sum(len(g.ids) for g in generated)
        return {
            "id": self.chat_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.chat_body.get("model"),
            "choices": choices,
            "usage": {
                "prompt_tokens": len(self.built.ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(self.built.ids) + completion_tokens,
            },
        }

    def _logprobs(self, generated: Generated) -> dict[str, Any] | None:
        """The sampled tokens' logprobs in chat's shape, when the client asked for them."""
        if (
            self.chat_body.get("logprobs") is not True
            or generated.logprobs is None
            or self.token_bytes is None
        ):
            return None
        entries = []
        for token, logprob in zip(generated.ids, generated.logprobs, strict=True):
            piece = self.token_bytes(token)
            entries.append(
                {
                    "token": piece.decode("utf-8", "replace"),
                    "logprob": logprob,
                    "bytes": list(piece),
                    "top_logprobs": [],
                }
            )
        return {"content": entries}

    # -- a stream ---------------------------------------------------------------------------------------

    def stream(self) -> ExactStream:
        return ExactStream(self)


@dataclass(slots=True)
class _Choice:
    """One choice of a stream: its parse as it grows, its ids so far, the decoder of their bytes, how it
    finished, and what was said."""

    stream: ReplyStream
    ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace")
    )
    finish: str | None = None
    weight_version: str | None = None
    opened: bool = False
    calls: int = 0


class ExactStream:
    """The engine's stream written to the client as a chat stream, as the ids arrive: a role chunk, then
    content and reasoning deltas, each tool call once its text is complete (so a client gets the call
    the whole answer would carry: docs/parsers.md), the finish chunk, usage when asked, `[DONE]`."""

    transforms: Literal[True] = True

    def __init__(self, translation: ExactTranslation) -> None:
        self._t = translation
        self._events = StreamAssembler(translation.endpoint, on_event=self._take)
        self._choices: dict[int, _Choice] = {}
        self._out: list[bytes] = []
        self._ended = False
        self._stamp = {
            "id": translation.chat_id,
            "object": "chat.completion.chunk",
            "created": translation.created,
            "model": translation.chat_body.get("model"),
        }

    @property
    def complete(self) -> bool:
        return self._ended

    @property
    def received(self) -> dict[str, Any] | None:
        """The engine's answer, assembled, for the record."""
        return self._events.result().body

    def relay(self, chunk: bytes) -> bytes:
        self._events.feed(chunk)
        return self._flush()

    def end(self) -> bytes:
        """The closing chunks when the engine's stream ended after every choice finished but without
        `[DONE]`."""
        if not self._ended and self._choices and all(c.finish is not None for c in self._choices.values()):
            self._close()
        return self._flush()

    def result(self) -> Assembled:
        events = self._events.result()
        parsed = self._parsed()
        body = self._t.completion(*parsed) if parsed is not None else None
        error = (
            events.error
            if events.error is not None or self._ended
            else "the engine's stream ended before its finish"
        )
        return Assembled(body, events.events, self._ended, error)

    def _take(self, event: dict[str, Any] | None) -> None:
        if event is None:  # [DONE]
            if not self._ended:
                self._close()
            return
        for generated in self._t.endpoint.generated(event, streamed=True):
            choice = self._choices.get(generated.index)
            if choice is None:
                choice = self._choices[generated.index] = _Choice(
                    ReplyStream(self._t.mode.parser, self._t.context)
                )
            new = generated.ids[len(choice.ids) :] if generated.cumulative else generated.ids
            if generated.logprobs is not None:
                choice.logprobs += (
                    generated.logprobs[len(choice.logprobs) :] if generated.cumulative else generated.logprobs
                )
            choice.ids += new
            choice.weight_version = generated.weight_version or choice.weight_version
            self._say(generated.index, choice, choice.stream.feed(self._decode(choice, new)))
            if generated.finish_reason is not None and choice.finish is None:
                choice.finish = generated.finish_reason
                rest = choice.decoder.decode(b"", final=True)
                if rest:
                    self._say(generated.index, choice, choice.stream.feed(rest))
                self._say(generated.index, choice, choice.stream.finish())
                reply = choice.stream.reply
                assert reply is not None  # finish() parsed it
                self._chunk(generated.index, {}, reply.finish_reason(choice.finish))

    def _decode(self, choice: _Choice, ids: Sequence[int]) -> str:
        """New ids' text; a character split across ids waits for its last byte."""
        token_bytes = self._t.token_bytes
        assert token_bytes is not None
        skipped = self._t.skipped
        return choice.decoder.decode(b"".join(token_bytes(i) for i in ids if i not in skipped))

    def _say(self, index: int, choice: _Choice, step: StreamStep) -> None:
        if not choice.opened:
            choice.opened = True
            self._chunk(index, {"role": "assistant", "content": ""})
        if step.reasoning:
            self._chunk(index, {"reasoning_content": step.reasoning})
        if step.content:
            self._chunk(index, {"content": step.content})
        for call in step.tool_calls:
            self._chunk(index, {"tool_calls": [{"index": choice.calls, **self._t.call(call)}]})
            choice.calls += 1

    def _chunk(self, index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        self._out.append(data_event({**self._stamp, "choices": [choice]}))

    def _close(self) -> None:
        self._ended = True
        parsed = self._parsed()
        if parsed is not None:
            self._t.settle(*parsed)
        options = self._t.chat_body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            completion = sum(len(c.ids) for c in self._choices.values())
            prompt = len(self._t.built.ids)
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            self._out.append(data_event({**self._stamp, "choices": [], "usage": usage}))
        self._out.append(DONE_EVENT)

    def _parsed(self) -> tuple[list[Generated], list[ParsedReply]] | None:
        """Each choice's ids and parse, in order, once every choice has finished."""
        ordered = sorted(self._choices.items())
        replies = [c.stream.reply for _, c in ordered if c.stream.reply is not None]
        if not ordered or len(replies) < len(ordered):
            return None
        generated = [Generated(i, c.ids, c.logprobs or None, c.finish, c.weight_version) for i, c in ordered]
        return generated, replies

    def _flush(self) -> bytes:
        out = b"".join(self._out)
        self._out.clear()
        return out
