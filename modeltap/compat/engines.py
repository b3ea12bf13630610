"""Which inference engine an upstream is, and how to ask it for the token ids it used.

Owns: telling vLLM, SGLang, `transformers serve` and AReaL's proxy apart by their discovery answers
(`GET /v1/models`, `/version`, `/server_info`, `/health`),
and, for one request, the body fields and headers that make that engine return its prompt and
completion ids (and the sampled tokens' logprobs), gated by the versions that have them
(docs/engines.md §3, §6). Does not own: fetching those answers (proxy/token_recorder.py), reading the ids
out of a response (the dialects: modeltap/dialects/token_ids.py) or what to do without them.

Pure functions over the decoded JSON; imports nothing of modeltap.

    engine = identify({"/v1/models": {"data": [{"owned_by": "vllm"}]}, "/version": {"version": "0.11.0"}})
    token_ask(engine, "chat", streamed=True, logprobs=False, body={})
    # TokenAsk(fields={'return_token_ids': True}, headers={})
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from packaging.version import InvalidVersion, Version

EngineChoice = Literal["auto", "vllm", "sglang", "transformers", "areal"]
ENGINE_CHOICES: tuple[EngineChoice, ...] = get_args(EngineChoice)
EngineName = Literal["vllm", "sglang", "transformers", "areal", "unknown"]
# The engines that return the ids they used (the others are counted, and their ids rendered).
ID_ENGINES = frozenset({"vllm", "sglang"})

# What is asked at start, cheapest and most telling first (docs/engines.md §3): the model card's
# `owned_by` names both engines; vLLM alone answers /version, SGLang alone /server_info (and
# /get_server_info before 0.5.6). `transformers serve` and AReaL's proxy answer /health with JSON,
# which vLLM and SGLang answer with an empty body (docs/engines.md §9.2).
PROBE_PATHS = ("/v1/models", "/version", "/server_info", "/get_server_info", "/health")

# The first releases with each extension (docs/engines.md §1.8, §2.8).
VLLM_TOKEN_IDS = Version("0.10.2")  # return_token_ids on chat and completions, streamed and not
SGLANG_TOKEN_IDS = Version("0.5.17")  # return_token_ids: completions, and chat when not streamed
SGLANG_SGLEXT = Version("0.5.20")  # x-sglext-* headers: chat prompt and output ids, streamed too

# SGLang's opt-in headers for chat ids (docs/engines.md §2.1): unconditional (no server flag), and
# they leave the body untouched. The framed variant (`x-sglext-ids-framed`) is never asked: its
# named `sglext_ids` event is not what an OpenAI client expects (§2.3).
SGLEXT_HEADERS = {"x-sglext-return-input-ids": "1", "x-sglext-return-output-ids": "1"}
# The endpoints (dialect names) either engine returns ids for.
TOKEN_ID_ENDPOINTS = frozenset({"chat", "completions"})


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """An upstream's engine, its version when it said, and where modeltap learned it."""

    name: EngineName
    version: str | None = None
    source: str = ""

    def describe(self) -> str:
        """`vllm 0.11.0 (GET /version)`, for the start-up report."""
        version = f" {self.version}" if self.version else ""
        return f"{self.name}{version} ({self.source})" if self.source else f"{self.name}{version}"


UNKNOWN = EngineInfo("unknown", None, "no engine answered the probes")


@dataclass(frozen=True, slots=True)
class TokenAsk:
    """What to add to one request so that the engine returns its ids: body fields (set only where the
    client did not set them) and headers."""

    fields: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.fields or self.headers)


def identify(answers: Mapping[str, Any]) -> EngineInfo:
    """The engine behind the discovery `answers` (decoded JSON by path, None where a path did not
    answer 200 with JSON), or UNKNOWN. A version is taken from /version (vLLM) or /server_info
    (SGLang) when one answered; `transformers serve` and AReaL's proxy report none."""
    owner = _model_owner(answers.get("/v1/models"))
    vllm_version = _version_of(answers.get("/version"))
    sglang_info = answers.get("/server_info") or answers.get("/get_server_info")
    sglang_version = _version_of(sglang_info) if not _is_vllm_dev_info(sglang_info) else None
    if owner == "vllm" or (owner is None and vllm_version is not None):
        source = "GET /v1/models owned_by" if owner else "GET /version"
        return EngineInfo("vllm", vllm_version, source)
    if owner == "sglang" or (owner is None and sglang_version is not None):
        source = "GET /v1/models owned_by" if owner else "GET /server_info"
        return EngineInfo("sglang", sglang_version, source)
    return _by_health(answers)


def _by_health(answers: Mapping[str, Any]) -> EngineInfo:
    """`transformers serve` (a model card's `status` object, or /health `{"status": "ok"}`) or AReaL's
    proxy (/health with `initialized`), else UNKNOWN (docs/engines.md §9.2)."""
    health = answers.get("/health")
    if isinstance(health, dict) and "initialized" in health:
        return EngineInfo("areal", None, "GET /health initialized")
    cards = answers.get("/v1/models")
    listed = cards.get("data") if isinstance(cards, dict) else None
    if isinstance(listed, list) and any(
        isinstance(c, dict) and isinstance(c.get("status"), dict) for c in listed
    ):
        return EngineInfo("transformers", None, "GET /v1/models status")
    if health == {"status": "ok"}:
        return EngineInfo("transformers", None, "GET /health")
    return UNKNOWN


def chosen(choice: EngineChoice) -> EngineInfo | None:
    """The engine an operator named (`--engine vllm|sglang|transformers|areal`), or None for `auto`
    (probe). A named engine has no version: its newest release's facts apply."""
    if choice not in ENGINE_CHOICES:
        raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, not {choice!r}")
    return None if choice == "auto" else EngineInfo(choice, None, "--engine")


def token_ask(
    engine: EngineInfo, endpoint: str, *, streamed: bool, logprobs: bool, body: Mapping[str, Any]
) -> TokenAsk | None:
    """The fields and headers that make `engine` return ids for a request of `endpoint` (a dialect
    name), or None when it cannot (an unknown engine, a version before the extension, an endpoint
    without one). A field the client already set is left as the client set it.

    vLLM: `return_token_ids` everywhere. SGLang: the sglext headers on chat (0.5.20+; `return_token_ids`
    on a streamed chat is a 400 there), `return_token_ids` on completions and, for 0.5.17 to 0.5.19,
    on non-streamed chat (docs/engines.md §3 step 4). With `logprobs`, the sampled tokens' logprobs:
    `logprobs: true` on chat, `logprobs: 0` (no alternatives) on completions. `transformers serve`
    returns no ids (and refuses unknown fields with 422), nor does AReaL's proxy."""
    if endpoint not in TOKEN_ID_ENDPOINTS or engine.name not in ID_ENGINES:
        return None
    version = _parsed(engine.version)
    fields: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if engine.name == "vllm":
        if version is not None and version < VLLM_TOKEN_IDS:
            return None
        fields["return_token_ids"] = True
    elif endpoint == "completions" or (not streamed and _within(version, SGLANG_TOKEN_IDS, SGLANG_SGLEXT)):
        if version is not None and version < SGLANG_TOKEN_IDS:
            return None
        fields["return_token_ids"] = True
    elif version is None or version >= SGLANG_SGLEXT:
        headers.update(SGLEXT_HEADERS)
    else:
        return None
    if logprobs:
        fields["logprobs"] = True if endpoint == "chat" else 0
    return TokenAsk({k: v for k, v in fields.items() if body.get(k) is None}, headers)


def _within(version: Version | None, low: Version, high: Version) -> bool:
    return version is not None and low <= version < high


def _model_owner(payload: Any) -> str | None:
    cards = payload.get("data") if isinstance(payload, dict) else None
    for card in cards if isinstance(cards, list) else []:
        owner = card.get("owned_by") if isinstance(card, dict) else None
        if owner in ("vllm", "sglang"):
            return str(owner)
    return None


def _version_of(payload: Any) -> str | None:
    version = payload.get("version") if isinstance(payload, dict) else None
    return version if isinstance(version, str) and _parsed(version) is not None else None


def _is_vllm_dev_info(payload: Any) -> bool:
    """vLLM's dev-mode /server_info holds `vllm_config`, never SGLang's `version` (docs/engines.md §1.7)."""
    return isinstance(payload, dict) and "vllm_config" in payload


def _parsed(version: str | None) -> Version | None:
    if version is None:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None
