"""SGLang's native generation endpoint: `POST /generate`, token ids (or text) in, text and token ids out.

Owns: the request's completion cap (`sampling_params.max_new_tokens`), its prompt (`input_ids` or
`text`, rendered by no template), the answer (`text`, `output_ids`, `meta_info` with the finish reason,
usage and the weight version), its stream (each chunk the whole output so far, by default, then
`[DONE]`), and its token ids. modeltap speaks it to an SGLang engine in `serve --tokens exact`
(proxy/exact.py); agents do not call it, so it has no route of its own (docs/engines.md §7).

Sources (SGLang v0.5.23): the request, `python/sglang/srt/managers/io_struct.py` (`GenerateReqInput`);
the answer and its `meta_info`, `python/sglang/srt/managers/tokenizer_manager.py`; the stream,
`python/sglang/srt/entrypoints/http_server.py` (`generate_request`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from modeltap.dialects.base import Prompt, Reading, TextPrompt, as_dict, as_int, as_str
from modeltap.dialects.roles import AsChat, CountsPrompt, OpenAIShaped, ThroughChat, TokenEndpoint
from modeltap.dialects.sse import DONE, DONE_EVENT, data_event, list_of
from modeltap.dialects.token_ids import Generated, TokenIds, id_list


class _Outputs:
    """The stream of `/generate`: each chunk holds the whole output so far (text and `output_ids`);
    the last one whose `meta_info.finish_reason` is set is the answer."""

    END: ClassVar[str] = DONE

    def __init__(self) -> None:
        self._last: dict[str, Any] | None = None

    def add(self, obj: dict[str, Any]) -> bool:
        self._last = obj
        return False

    def whole(self) -> bool:
        """The last chunk carries the finish reason: the output is complete, [DONE] or not."""
        return (
            self._last is not None and as_dict(self._last.get("meta_info")).get("finish_reason") is not None
        )

    def body(self) -> dict[str, Any] | None:
        return self._last


class Generate(OpenAIShaped, TokenEndpoint, declines=(AsChat, ThroughChat, CountsPrompt)):
    """A prompt of ids in, ids out: no conversation, nothing to translate."""

    name = "generate"
    route = "generate"
    operation = "text_completion"

    def completion_field(self, body: Mapping[str, Any]) -> str:
        return "max_new_tokens"

    def prompt(self, body: dict[str, Any], *, openai_typed: bool = False) -> Prompt:
        ids = id_list(body.get("input_ids"))
        return TextPrompt(ids if ids is not None else body["text"])

    def read(self, reply: dict[str, Any]) -> Reading:
        finish = as_dict(as_dict(reply.get("meta_info")).get("finish_reason")).get("type")
        return as_str(finish), as_str(reply.get("text")), []

    def usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        meta = as_dict(reply.get("meta_info"))
        return as_int(meta.get("prompt_tokens")), as_int(meta.get("completion_tokens"))

    def cache_usage(self, reply: dict[str, Any]) -> tuple[int | None, int | None]:
        return as_int(as_dict(reply.get("meta_info")).get("cached_tokens")), None

    def assembler(self) -> _Outputs:
        return _Outputs()

    def synthesise(self, body: dict[str, Any], include_usage: bool) -> list[bytes]:
        """The answer as one chunk (each chunk is the output so far, the last the answer), then `[DONE]`."""
        return [data_event(body), DONE_EVENT]

    def event_bytes(self, event: dict[str, Any]) -> bytes:
        return data_event(event)

    def token_ids(self, request: Any, response: Any) -> TokenIds | None:
        """The request's `input_ids` and the answer's `output_ids`, with
        `meta_info.output_token_logprobs` (`[logprob, id, text]` each) when their count matches."""
        prompt = id_list(as_dict(request).get("input_ids"))
        completion = id_list(as_dict(response).get("output_ids"))
        if prompt is None or completion is None:
            return None
        return TokenIds(prompt, completion, _logprobs(as_dict(response), len(completion)))

    def generated(self, body: Any, *, streamed: bool) -> list[Generated]:
        """The answer's `output_ids` (a stream chunk's are the output so far: SGLang streams cumulative
        outputs unless it runs with `--incremental-streaming-output`), its finish reason's `type` and
        weight version; an answer to `n` > 1 is a list of such answers, each with its `index`."""
        answers = body if isinstance(body, list) else [body]
        out = []
        for position, answer in enumerate(answers):
            answer = as_dict(answer)
            ids = id_list(answer.get("output_ids"))
            if ids is None:
                continue
            meta = as_dict(answer.get("meta_info"))
            index = answer.get("index")
            out.append(
                Generated(
                    index if isinstance(index, int) and not isinstance(index, bool) else position,
                    ids,
                    _logprobs(answer, len(ids)),
                    as_str(as_dict(meta.get("finish_reason")).get("type")),
                    as_str(meta.get("weight_version")),
                    cumulative=streamed,
                )
            )
        return out


def _logprobs(answer: dict[str, Any], count: int) -> list[float | None] | None:
    """`meta_info.output_token_logprobs` (`[logprob, id, text]` each) when there is one per id."""
    entries = list_of(as_dict(answer.get("meta_info")).get("output_token_logprobs"))
    logprobs = [_number(entry[0]) if isinstance(entry, list) and entry else None for entry in entries]
    return logprobs if len(logprobs) == count and count else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


DIALECT = Generate()
