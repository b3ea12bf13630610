"""ProxyConfig: every setting of one proxy, with its default, its help and the reason for it.

Owns: the option names (one spelling, shared by the CLI flags, which cli.py generates from these
fields, and the `MODELTAP_<OPTION>` environment variables), defaults, and validation. Does not own:
parsing argv (cli.py) or acting on a setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from modeltap.compat.engines import ENGINE_CHOICES, EngineChoice
from modeltap.compat.layouts import LAYOUTS, Layout
from modeltap.dialects import routes

DEFAULT_STORE = ".modeltap/records.db"
# `modeltap serve`'s port unless told otherwise: one to remember and put in an agent's config once.
DEFAULT_PORT = 8840
# Agents paste whole files and base64 images into prompts, so aiohttp's 1 MiB default would answer
# them 413; 64 MiB covers a 128k-token transcript with several images many times over.
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# A whole (not streamed) answer is read, parsed and recorded in memory: a model's answer is kilobytes,
# one with every prompt token's top logprobs at 128k tokens about 200 MB; past the limit an upstream
# that never stops would take the serving process's memory. A stream is relayed as it comes.
DEFAULT_MAX_REPLY_BYTES = 256 * 1024 * 1024
# Connecting to a live upstream on the same host or LAN takes milliseconds; 10 s means it is down.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# The longest silence allowed between two chunks of an upstream response. AReaL generates the whole
# completion before it sends the first byte, even when streaming (docs/areal.md §1.1.7), and its own
# client waits up to an hour (rollout.request_timeout, §4.3), so the default is that hour.
DEFAULT_READ_TIMEOUT_S = 3600.0
# A client that has not finished sending its headers and body within this is treated as gone
# (slowloris); the largest legitimate body on loopback arrives in well under a second.
DEFAULT_CLIENT_TIMEOUT_S = 60.0
# Sessions idle longer than this are closed: AReaL's own proxy forgets its sessions after an hour
# (rollout.agent.session_timeout_seconds, docs/areal.md §5.1), so a longer-lived token would only
# point at an upstream session that no longer exists.
DEFAULT_SESSION_TTL_S = 3600.0

BudgetPolicy = Literal["clamp", "reject", "off"]
BUDGET_POLICIES: tuple[BudgetPolicy, ...] = get_args(BudgetPolicy)
TokensMode = Literal["off", "observe", "exact"]
TOKENS_MODES: tuple[TokensMode, ...] = get_args(TokensMode)
# Where records are written: a writer process beside the serving one (docs/performance.md), or a
# thread of the serving process (no process to start: an embedding that may not spawn one).
RecordWriter = Literal["process", "thread"]
RECORD_WRITERS: tuple[RecordWriter, ...] = get_args(RecordWriter)
# serve's event loop: uvloop when the `fast` extra installed it (auto), or asyncio's own.
EventLoop = Literal["auto", "uvloop", "asyncio"]
EVENT_LOOPS: tuple[EventLoop, ...] = get_args(EventLoop)


def option(default: Any, help: str, *, flag: str | None = None, secret: bool = False) -> Any:
    """A ProxyConfig field: its default, the help of its flag, and the flag's name when it is not
    `--NAME-WITH-DASHES` (a unit suffix such as `_s` is left out of the flag)."""
    metadata = {"help": help, "flag": flag}
    if isinstance(default, list | dict):
        return field(default_factory=type(default), metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


@dataclass
class ProxyConfig:
    """Settings of one modeltap proxy.

    >>> ProxyConfig(upstream="http://127.0.0.1:8000", host="127.0.0.1").layout
    'auto'
    """

    upstream: str | None = option(None, "base URL of the OpenAI/Anthropic-compatible server (AReaL, vLLM, …)")
    host: str = option(
        "0.0.0.0", "address to listen on (default 0.0.0.0: all interfaces, so containers reach it)"
    )
    port: int = option(DEFAULT_PORT, f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    layout: Layout = option("auto", "the upstream's path layout (default auto)")
    upstream_key: str | None = option(None, "API key to send upstream instead of the client's", secret=True)
    model: str | None = option(None, "model name that GET /v1/models lists when the upstream has none")
    store: str = option(DEFAULT_STORE, f"records database (default {DEFAULT_STORE})")
    admin_key: str | None = option(
        None, "key for the admin API /_modeltap/sessions (default: random, printed)", secret=True
    )
    admin_remote: bool = option(False, "serve the admin API beyond loopback too")
    lend_key_to_anonymous: bool = option(
        False, "on a non-loopback listener, send --upstream-key for requests without a session token too"
    )
    allow_origins: list[str] = option(
        [],
        "let web pages of this origin (e.g. http://localhost:3000) use the proxy from a browser; "
        "repeatable, * for any (default: none)",
        flag="--allow-origin",
    )
    allow_hosts: list[str] = option(
        [],
        "answer requests addressed by this Host name too (a reverse proxy's), besides the listener's own "
        "names and addresses; repeatable, * for any",
        flag="--allow-host",
    )
    sync: bool = option(False, "commit each record before its response ends")
    workers: int = option(
        1, "serving processes on the port, sharing sessions and one record writer (default 1; see docs)"
    )
    record_writer: RecordWriter = option(
        "process", "where records are written: process (a writer process beside serve; default) or thread"
    )
    event_loop: EventLoop = option(
        "auto", "serve's event loop: auto (uvloop if installed: modeltap[fast]), uvloop or asyncio"
    )
    tokenizer: str | None = option(None, "local HF tokenizer folder (or cached name) of the served model")
    context_length: int | None = option(None, "the model's context length (default: ask the upstream)")
    engine_max_tokens: int | None = option(None, "AReaL's rollout.agent.engine_max_tokens, if set")
    reserve: int = option(0, "tokens to keep free below the context length (default 0)")
    budget: BudgetPolicy = option("clamp", "over-budget policy (default clamp)")
    min_completion_tokens: int = option(1, "reject when fewer would remain (default 1)")
    chat_template_kwargs: dict[str, Any] = option(
        {}, """the server's chat template kwargs as JSON, e.g. '{"enable_thinking": false}'"""
    )
    connect_timeout_s: float = option(
        DEFAULT_CONNECT_TIMEOUT_S,
        f"seconds (default {DEFAULT_CONNECT_TIMEOUT_S:g})",
        flag="--connect-timeout",
    )
    read_timeout_s: float = option(
        DEFAULT_READ_TIMEOUT_S,
        f"longest upstream silence, seconds (default {DEFAULT_READ_TIMEOUT_S:g})",
        flag="--read-timeout",
    )
    client_timeout_s: float = option(
        DEFAULT_CLIENT_TIMEOUT_S,
        f"seconds a client may take to send its request (default {DEFAULT_CLIENT_TIMEOUT_S:g})",
        flag="--client-timeout",
    )
    max_body_bytes: int = option(DEFAULT_MAX_BODY_BYTES, "largest request body accepted (default 64 MiB)")
    max_reply_bytes: int = option(
        DEFAULT_MAX_REPLY_BYTES, "largest whole (not streamed) upstream answer relayed (default 256 MiB)"
    )
    session_ttl_s: float = option(
        DEFAULT_SESSION_TTL_S,
        f"idle seconds before a session closes (default {DEFAULT_SESSION_TTL_S:g})",
        flag="--session-ttl",
    )
    keep_raw_sse: bool = option(False, "also store streams' raw bytes")
    max_store_bytes: int | None = option(
        None, "warn once when the records database grows past this many bytes (then: modeltap prune)"
    )
    tokens: TokensMode = option(
        "off",
        "token ids: observe records the ids the engine used (asked of vLLM and SGLang, else rendered by "
        "--tokenizer); exact builds each prompt's ids itself from the session's earlier ids and sends "
        "them to the engine's token endpoint, so the ids trained on are the model's (needs --tokenizer)",
    )
    token_ids: bool = option(False, "the same as --tokens observe")
    logprobs: bool = option(False, "with --tokens, also ask for the sampled tokens' logprobs")
    engine: EngineChoice = option(
        "auto",
        "the upstream's engine, for counting as it prepares messages and for --tokens (default auto: "
        "ask it; a transformers server answers /health with JSON: docs/engines.md §7.1)",
    )
    tool_parser: str | None = option(
        None, "with --tokens exact, the tool-call parser vLLM would use (default: told by the chat template)"
    )
    reasoning_parser: str | None = option(
        None, "with --tokens exact, the reasoning parser vLLM would use (default: told by the chat template)"
    )
    observers: list[str] = option(
        [], "an observer of every exchange, MODULE:ATTR (a class or factory); repeatable", flag="--observer"
    )
    otlp_endpoint: str | None = option(
        None,
        "export a span per exchange to this OTLP/HTTP collector, e.g. http://collector:4318 (/v1/traces"
        " is appended; default $OTEL_EXPORTER_OTLP_ENDPOINT); needs pip install 'modeltap[otlp]'",
    )
    otlp_content: bool = option(
        False,
        "with the spans, export prompts and replies too (each text cut at 8192 characters: docs/otel.md §3)",
    )

    def __post_init__(self) -> None:
        if self.tokens not in TOKENS_MODES:
            raise ValueError(f"tokens must be one of {', '.join(TOKENS_MODES)}, not {self.tokens!r}")
        if self.token_ids and self.tokens == "off":
            self.tokens = "observe"
        # `token_ids` says whether any token ids are recorded, whichever flag asked for them.
        self.token_ids = self.tokens != "off"
        if self.tokens == "exact" and self.tokenizer is None:
            raise ValueError("--tokens exact builds prompt ids with the served tokenizer: give --tokenizer")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {self.layout!r}")
        if self.engine not in ENGINE_CHOICES:
            raise ValueError(f"engine must be one of {', '.join(ENGINE_CHOICES)}, not {self.engine!r}")
        if self.record_writer not in RECORD_WRITERS:
            choices = ", ".join(RECORD_WRITERS)
            raise ValueError(f"record_writer must be one of {choices}, not {self.record_writer!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, not {self.workers}")
        if self.workers > 1 and self.record_writer != "process":
            raise ValueError(
                "workers share one record writer process: --workers needs --record-writer process"
            )
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, not {self.event_loop!r}")
        if self.budget not in BUDGET_POLICIES:
            raise ValueError(f"budget must be one of {', '.join(BUDGET_POLICIES)}, not {self.budget!r}")
        if self.upstream is not None:
            self.upstream = self.upstream.rstrip("/")
            check_upstream_url(self.upstream, "--upstream")
            if not self.upstream.startswith(("http://", "https://")):
                raise ValueError(f"upstream must be an http(s) URL, not {self.upstream!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, not {self.port}")
        for name in ("max_body_bytes", "max_reply_bytes"):
            if getattr(self, name) < 1024:
                raise ValueError(f"{name} must be at least 1024")
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"otlp_endpoint must be an http(s) URL, not {self.otlp_endpoint!r}")
        self.allow_origins = [origin.rstrip("/") for origin in self.allow_origins]
        if os.pathsep in self.store:
            raise ValueError(
                f"store must be one database path, not the list {self.store!r}: a proxy writes one store "
                "(the readers take several)"
            )

    @property
    def store_path(self) -> Path:
        return Path(self.store)

    @classmethod
    def from_sources(cls, flags: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> ProxyConfig:
        """Merge flags over `MODELTAP_<OPTION>` environment variables over defaults.

        A flag given as None counts as absent, so the environment fills it.
        """
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if flags.get(f.name) is not None:
                values[f.name] = flags[f.name]
            elif (raw := env.get("MODELTAP_" + f.name.upper())) is not None:
                values[f.name] = parse_env(f, raw)
        return cls(**values)


def check_upstream_url(url: str, what: str) -> None:
    """Raise ValueError, in one line that does not repeat a password, when `url` cannot be an
    upstream's base URL: it holds `user:password@` (modeltap would print it at start, keep it in
    every record of the session and send it beside the upstream key, which aiohttp refuses) or a
    query (`?key=`), or it names an endpoint (`…/v1/chat/completions`), which would fail at the first
    request with a 404.

    >>> check_upstream_url("http://me:hunter2@gpu:8000/v1", "--upstream")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --upstream must not hold a user or password (user:password@host): modeltap would ...
    >>> check_upstream_url("http://gpu:8000/v1/chat/completions", "--upstream")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --upstream is the server's base URL, not an endpoint: give http://gpu:8000/v1 ...
    """
    scheme, _, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority.split("?", 1)[0].split("#", 1)[0]:  # the userinfo, not an `@` in a query
        raise ValueError(
            f"{what} must not hold a user or password (user:password@host): modeltap would print and "
            "store it; give the key with --upstream-key (or a session's upstream_key)"
        )
    if "?" in rest or "#" in rest:
        # modeltap appends each endpoint's path to the base, which a query would end up inside; and a
        # key in it (`?key=`) would be printed at start and kept with every session.
        raise ValueError(
            f"{what} is a base URL and takes no query string or fragment: give a key with --upstream-key"
        )
    path = "/" + path.rstrip("/") if slash else ""
    for route in sorted(routes(), key=len, reverse=True):
        if path.endswith("/" + route):
            base = f"{scheme}://{authority}{path.removesuffix('/' + route)}"
            raise ValueError(
                f"{what} is the server's base URL, not an endpoint: give {base} (modeltap adds /{route} "
                "and every other endpoint's path itself)"
            )


def otlp_traces_endpoint(config: ProxyConfig, env: Mapping[str, str] = os.environ) -> str | None:
    """Where spans go, or None for no export: `--otlp-endpoint` (or MODELTAP_OTLP_ENDPOINT) with
    `/v1/traces` appended, else OpenTelemetry's own variables as its SDKs read them:
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as it is, else OTEL_EXPORTER_OTLP_ENDPOINT with `/v1/traces`
    appended (https://opentelemetry.io/docs/specs/otel/protocol/exporter/). A base that already ends in
    `/v1/traces` is taken as it is.

    >>> otlp_traces_endpoint(ProxyConfig(otlp_endpoint="http://collector:4318"), env={})
    'http://collector:4318/v1/traces'
    """
    if config.otlp_endpoint:
        return _traces_url(config.otlp_endpoint)
    if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return _traces_url(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    return None


def _traces_url(base: str) -> str:
    base = base.rstrip("/")
    return base if base.endswith("/v1/traces") else base + "/v1/traces"


def parse_env(f: dataclasses.Field[Any], raw: str) -> Any:
    """An environment variable's text as the value of field `f`."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
    if kind.startswith("bool"):
        return raw.strip().lower() in ("1", "true", "yes", "on")
    if kind.startswith("int"):
        return int(raw)
    if kind.startswith("float"):
        return float(raw)
    if kind.startswith("dict"):
        return json.loads(raw)
    if kind.startswith("list"):
        return [item for item in raw.split(",") if item]
    return raw
