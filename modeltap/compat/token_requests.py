"""What each engine's token endpoint takes: a chat request's sampling, mapped onto vLLM's
`/v1/completions` with the prompt as ids and onto SGLang's `/generate` with `input_ids`.

Owns: which chat request fields are sampling (`Sampling.of_chat`: temperature, top_p, top_k, min_p,
the completion cap, stop strings and ids, seed, n, logprobs, the penalties) and each engine's names
for them, with the facts that make a token-in request mean what the chat request meant (docs/exact.md
§2-§3): the cap is always sent (vLLM's completions default is 16 tokens, SGLang's 128), special tokens
are skipped in the engine's text as the chat route would skip them (modeltap decodes the ids itself,
alike), SGLang's seed is `sampling_seed`.
Does not own: building the ids (modeltap/counting/continuation.py), sending (proxy/exact.py), or reading
the answer (the dialects: openai_completions.py, sglang_generate.py).

Pure functions over dicts; imports nothing of modeltap.

    sampling = Sampling.of_chat({"temperature": 0.7, "max_tokens": 512, "seed": 3}, max_tokens=512)
    vllm_completions("m", [151644, 872], sampling, stream=True)
    # {"model": "m", "prompt": [151644, 872], "max_tokens": 512, "temperature": 0.7, "seed": 3, ...}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A chat request's `top_logprobs` at most (OpenAI's limit): more is the client's error, not ours.
TOP_LOGPROBS_MAX = 20


@dataclass(frozen=True, slots=True)
class Sampling:
    """A chat request's sampling, engine-neutral. `max_tokens` is the completion cap after the budget;
    `logprobs` is None (none asked), 0 (the sampled tokens' only) or the number of alternatives."""

    max_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    n: int = 1
    logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None

    @classmethod
    def of_chat(cls, body: Mapping[str, Any], *, max_tokens: int) -> Sampling:
        """The sampling of an OpenAI chat request (with vLLM's and SGLang's chat extensions: top_k,
        min_p, repetition_penalty, stop_token_ids); fields of the wrong type are left to the engine's
        defaults, as the chat route's validation would refuse them."""
        stop = body.get("stop")
        stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop or () if isinstance(s, str))
        logprobs = None
        if body.get("logprobs") is True:
            top = _int(body.get("top_logprobs")) or 0
            logprobs = min(max(top, 0), TOP_LOGPROBS_MAX)
        return cls(
            max_tokens=max_tokens,
            temperature=_number(body.get("temperature")),
            top_p=_number(body.get("top_p")),
            top_k=_int(body.get("top_k")),
            min_p=_number(body.get("min_p")),
            stop=stops,
            stop_token_ids=tuple(i for i in body.get("stop_token_ids") or () if isinstance(i, int)),
            seed=_int(body.get("seed")),
            n=max(_int(body.get("n")) or 1, 1),
            logprobs=logprobs,
            presence_penalty=_number(body.get("presence_penalty")),
            frequency_penalty=_number(body.get("frequency_penalty")),
            repetition_penalty=_number(body.get("repetition_penalty")),
        )

    def _common(self) -> dict[str, Any]:
        named = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty,
        }
        out: dict[str, Any] = {key: value for key, value in named.items() if value is not None}
        if self.stop:
            out["stop"] = list(self.stop)
        if self.stop_token_ids:
            out["stop_token_ids"] = list(self.stop_token_ids)
        if self.n != 1:
            out["n"] = self.n
        return out


def vllm_completions(
    model: str, ids: list[int], sampling: Sampling, *, stream: bool, skip_special_tokens: bool = False
) -> dict[str, Any]:
    """A vLLM `/v1/completions` request of prompt `ids` (vLLM v0.10.2 and later return the ids:
    `return_token_ids`; docs/exact.md §2). `skip_special_tokens` is what vLLM's chat route would
    detokenize with for the parsers in use (compat/parsers `ReplyParser.skip_special_tokens`); a stream
    ends with a usage chunk."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": ids,
        "max_tokens": sampling.max_tokens,
        "return_token_ids": True,
        # The policy version of the completion (vLLM 0.33; earlier releases ignore the field).
        "return_weight_versions": True,
        "skip_special_tokens": skip_special_tokens,
        **sampling._common(),
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.logprobs is not None:
        body["logprobs"] = sampling.logprobs
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def sglang_generate(
    ids: list[int], sampling: Sampling, *, stream: bool, skip_special_tokens: bool = False
) -> dict[str, Any]:
    """An SGLang `/generate` request of `input_ids` (docs/exact.md §3). The seed is `sampling_seed`,
    which SGLang applies only when it runs with `--enable-deterministic-inference`."""
    params: dict[str, Any] = {
        "max_new_tokens": sampling.max_tokens,
        "skip_special_tokens": skip_special_tokens,
        **sampling._common(),
    }
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    body: dict[str, Any] = {"input_ids": ids, "sampling_params": params}
    if sampling.logprobs is not None:
        body["return_logprob"] = True
        if sampling.logprobs:
            body["top_logprobs_num"] = sampling.logprobs
    if stream:
        body["stream"] = True
    return body


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
