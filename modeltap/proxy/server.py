"""build_app(config) -> aiohttp Application, and Proxy: the app started and stopped in-process.

Owns: the app's routes and lifecycle (the tokenizer, budget and token-id recorder are set up, and the
store and the upstream pools start with the app and close with it, in `cleanup_ctx`), its observers
in order (the record store first, then OTLP export, then `--observer` ones, then those given in
process), binding, and the base URLs a host process and a container should use.
Does not own: what happens to one request (relay.py).

    async with Proxy(ProxyConfig(upstream="http://127.0.0.1:8000", port=0), observers=[printer]) as proxy:
        session = proxy.sessions.open(upstream_key="sk-...", labels={"task_id": "t1"})
        print(session.host_base_url + "/v1")
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import importlib
import logging
import textwrap
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from modeltap import dialects
from modeltap.compat.engines import ID_ENGINES, EngineInfo, chosen
from modeltap.compat.engines import UNKNOWN as UNKNOWN_ENGINE
from modeltap.compat.hosts import is_loopback
from modeltap.compat.layouts import LAYOUT_HELP, serves
from modeltap.dialects.roles import ThroughChat
from modeltap.proxy import admin, listener, naming, network, observers, relay
from modeltap.proxy.config import ProxyConfig, otlp_traces_endpoint
from modeltap.proxy.context import CONTEXT, ProxyContext
from modeltap.proxy.sessions import Session, SessionRegistry
from modeltap.proxy.token_recorder import TokenIdRecorder, probe
from modeltap.proxy.workers import LocalSharing, ReplicaSharing, WorkerSetup
from modeltap.records.channel import RecordChannel
from modeltap.records.exchange import RolloutOutcome, SessionEvent
from modeltap.records.store import RecordStore
from modeltap.records.writer_process import WriterOptions, WriterProcess

if TYPE_CHECKING:
    from modeltap.counting.counter import TokenCounter
    from modeltap.exporters.otlp import OtlpExport
    from modeltap.proxy.budget import Budget
    from modeltap.proxy.exact import ExactMode

log = logging.getLogger(__name__)

# Idle sessions are looked for at least this often (and at a quarter of the TTL when that is shorter).
EXPIRY_SWEEP_MAX_S = 60.0
# How long a graceful stop waits for running exchanges (a stream mid-generation) before cancelling them.
SHUTDOWN_TIMEOUT_S = 10.0
# Connections waiting to be accepted. AReaL starts hundreds of rollouts at once; with aiohttp's default
# of 128, 2,000 agents connecting together overflowed it 132 times (a dropped SYN is retried 1 s later):
# benchmarks/load_sessions.py. The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096

# What `pip install 'modeltap[budget]'` adds (pyproject.toml): the chat template's, the tokenizer's and
# the fast encoder's libraries.
_BUDGET_EXTRA = frozenset({"jinja2", "tokenizers", "tiktoken"})

BaseUrls = Callable[[], tuple[str, str | None]]
# Every path, a percent-encoded newline included (`.*` stops at one, and aiohttp would answer such a
# path with its own plain-text 404, in no client's shape and unrecorded).
_EVERY_PATH = r"/{tail:[\s\S]*}"


def build_app(
    config: ProxyConfig,
    base_urls: BaseUrls | None = None,
    extra_observers: Sequence[object] = (),
    writer_observers: Sequence[str] = (),
    setup: WorkerSetup | None = None,
) -> web.Application:
    """The proxy as an aiohttp Application. `base_urls` returns (host URL, container URL or None) for
    session URLs; by default they are derived from the configured host and port. The observers are
    the record store, then OTLP export (when asked for), then those `config.observers` names, then
    `extra_observers`; `writer_observers` (factories `MODULE:ATTR`) see each exchange in the record
    writer process once it is written (records/writer_process.py). With `setup`, the app is one of
    `serve --workers N` other than the first (workers.py): its records go to the first one's writer
    and its sessions are the first one's."""
    exports = _otlp(config)
    store, writer = _records(config, writer_observers, setup)
    seam = observers.Observers(
        [store, *exports, *(observers.load(spec) for spec in config.observers), *extra_observers]
    )

    def session_changed(session: Session, closed: bool) -> None:
        seam.session(
            SessionEvent("closed" if closed else "opened", session.id, dict(session.labels), session.upstream)
        )

    urls = base_urls or (lambda: _base_urls(config.host, config.port))
    if setup is None:
        sessions = SessionRegistry(urls, session_changed, ttl_s=config.session_ttl_s)
    else:  # a copy of the first worker's, which records the sessions and expires them
        sessions = SessionRegistry(urls)
    sharing = LocalSharing(sessions) if setup is None else ReplicaSharing(sessions)
    ctx = ProxyContext(
        config,
        sessions,
        store,
        seam,
        loopback_only=is_loopback(config.host),
        writer=writer,
        sharing=sharing,
        setup=setup,
    )
    if setup is not None:
        ctx.admin_key = setup.admin_key
    elif config.admin_key:
        ctx.admin_key = config.admin_key
    # Agents paste whole files into prompts: aiohttp's 1 MiB default would answer them 413.
    app = web.Application(client_max_size=config.max_body_bytes)
    app[CONTEXT] = ctx
    # Export stops after the app's own teardown, which may still deliver the last exchanges.
    app.cleanup_ctx.extend(export.lifecycle for export in exports)
    app.cleanup_ctx.append(_lifecycle)
    app.router.add_get("/_modeltap/health", _health)
    admin.add_routes(app)
    # Connectivity checks (Claude Code's HEAD /api/hello: docs/agents.md §4.2) just need an answer.
    app.router.add_route("HEAD", _EVERY_PATH, _head)
    app.router.add_route("*", _EVERY_PATH, relay.handle)
    return app


def _records(
    config: ProxyConfig, writer_observers: Sequence[str], setup: WorkerSetup | None
) -> tuple[RecordStore | RecordChannel, WriterProcess | None]:
    """The record store the observers see, and the writer process behind it when this process owns it."""
    raw, most = config.keep_raw_sse, config.max_store_bytes
    if setup is not None:
        options = WriterOptions(
            str(config.store_path), keep_raw_sse=raw, max_bytes=most, address=setup.writer_address
        )
        return RecordChannel(setup.writer_address, options, sync=config.sync), None
    if config.record_writer == "thread":
        if writer_observers:
            raise ValueError("observers of the record writer process need --record-writer process")
        return RecordStore(config.store_path, keep_raw_sse=raw, sync=config.sync, max_bytes=most), None
    options = WriterOptions(
        str(config.store_path), keep_raw_sse=raw, max_bytes=most, observers=list(writer_observers)
    )
    writer = WriterProcess(options)
    return RecordChannel(writer.address, writer.options, sync=config.sync), writer


def _otlp(config: ProxyConfig) -> list[OtlpExport]:
    """The OTLP exporter, when `--otlp-endpoint` or OpenTelemetry's own variables ask for one. Without
    the optional packages, the flag is an error; the variables alone (set for other tools) a warning."""
    endpoint = otlp_traces_endpoint(config)
    if endpoint is None:
        return []
    try:
        from modeltap.exporters.otlp import OtlpExport
    except ImportError as exc:
        if config.otlp_endpoint:
            raise ValueError(f"--otlp-endpoint: {exc}") from exc
        log.warning("not exporting spans to %s: %s", endpoint, exc)
        return []
    return [OtlpExport(endpoint, content=config.otlp_content)]


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    ctx = app[CONTEXT]
    counter = await _counter(ctx)
    ctx.budget, ctx.budget_report = await _budget(ctx, counter)
    ctx.token_ids, ctx.token_ids_report = await _token_ids(ctx, counter)
    ctx.exact, exact_report = await _exact(ctx, counter)
    if ctx.exact is not None:
        ctx.token_ids_report = exact_report
    await ctx.start_records()
    if ctx.config.upstream is not None:
        ctx.default_upstream = ctx.upstream(ctx.config.upstream)
    if ctx.setup is None:  # the first worker expires sessions for all
        ctx.tasks.spawn(_expire_sessions(ctx), "expire-sessions")
    try:
        yield
    finally:
        await ctx.close()
        await ctx.close_records()


async def _counter(ctx: ProxyContext) -> TokenCounter | None:
    """The served model's tokenizer, when a budget or `--token-ids` needs it and one is configured,
    counting as the served engine prepares messages (`_served_engine`)."""
    config = ctx.config
    if config.tokenizer is None or (config.budget == "off" and not config.token_ids):
        return None
    _require_budget_extra()
    from modeltap.compat.preparations import preparation
    from modeltap.counting.counter import TokenCounter

    engine = await _served_engine(ctx)
    # AReaL drops a request's chat_template_kwargs and validates chat bodies against the openai SDK's
    # types, which reorders each tool's keys (docs/areal.md §1.1.6): count what it renders.
    areal = engine.name == "areal"
    # Off the loop: a first load reads the vocabulary for a second or two (a later one, of the same
    # folder in this process, is shared: tokens.SHARED).
    return await asyncio.to_thread(
        TokenCounter.load,
        config.tokenizer,
        config.chat_template_kwargs,
        request_template_kwargs=not areal,
        openai_typed_chat=areal,
        preparation=preparation(engine.name, engine.version),
    )


async def _served_engine(ctx: ProxyContext) -> EngineInfo:
    """The engine whose message preparation the counter follows (docs/engines.md §7.1): `--engine`,
    else AReaL's proxy behind an AReaL layout (or behind the adapter, inside AReaL), else what the
    default upstream's discovery answers say (its version picks the release); with neither, UNKNOWN."""
    config = ctx.config
    named = chosen(config.engine)
    if named is not None:
        return named
    if config.layout in ("areal", "areal-gateway"):
        return EngineInfo("areal", None, "--layout")
    if config.upstream is None:
        # Sessions name their upstreams: under `auto` where AReaL is installed, that is the adapter in
        # AReaL's rollout workers, whose upstreams are AReaL's proxy or gateway.
        return EngineInfo("areal", None, "auto") if ctx.auto_first == "areal" else UNKNOWN_ENGINE
    engine, _ = await probe(ctx.upstream(config.upstream), _probe_headers(config))
    return engine


async def _budget(ctx: ProxyContext, counter: TokenCounter | None) -> tuple[Budget | None, str]:
    """The token budget in force and the start-up line that says so, with where each limit came from."""
    config = ctx.config
    if config.budget == "off":
        return None, "off (--budget off)"
    if counter is None:
        return None, "off (no --tokenizer: modeltap counts only with the served model's own tokenizer)"
    from modeltap.proxy.budget import Budget, Limits, discover_limits

    context_length, source = config.context_length, "--context-length"
    if context_length is None and config.upstream is not None:
        context_length, source = await discover_limits(ctx.upstream(config.upstream), _probe_headers(config))
    if context_length is None:
        return None, f"off: no context length ({source}); give --context-length"
    sources = {"context_length": source, "engine_max_tokens": "--engine-max-tokens", "reserve": "--reserve"}
    limits = Limits(context_length, config.engine_max_tokens, config.reserve, sources)
    budget = Budget(counter, limits, config.budget, config.min_completion_tokens)
    prepared = counter.preparation.describe()
    return (
        budget,
        f"{config.budget} with {config.tokenizer} as {prepared} prepares messages: {limits.describe()}",
    )


def _require_budget_extra() -> None:
    """Import the budget's libraries (the `budget` extra, ~15 MB, loaded only by a proxy that counts),
    or raise RuntimeError saying what to install."""
    for name in sorted(_BUDGET_EXTRA):
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            raise RuntimeError(
                f"--tokenizer needs the budget's dependencies ({name} is not installed): "
                "pip install 'modeltap[budget]'"
            ) from exc


async def _token_ids(ctx: ProxyContext, counter: TokenCounter | None) -> tuple[TokenIdRecorder | None, str]:
    """The token-id recorder, with the default upstream's engine learnt at start, and its start-up line.
    Where the served tokenizer renders ids, the record store decodes the ids around a break with it and
    knows the ids a turn ends on."""
    config = ctx.config
    if not config.token_ids:
        return None, "off (--tokens observe records the engine's ids, --tokens exact builds them)"
    renderer = None
    if counter is not None:
        from modeltap.counting.ids import IdRenderer  # the [budget] extra, loaded only with a tokenizer

        renderer = await asyncio.to_thread(IdRenderer, counter)
    recorder = TokenIdRecorder(config, renderer)
    if renderer is not None:
        ctx.decode_ids_with(renderer, renderer.turn_ends())
    rendered = f"rendered with {config.tokenizer}" if renderer is not None else None
    if config.upstream is None:
        return recorder, f"asked of each session's upstream; {rendered or 'not rendered (no --tokenizer)'}"
    engine = await recorder.engine(ctx.upstream(config.upstream), _probe_headers(config))
    if engine.name in ID_ENGINES:
        fallback = f", else {rendered}" if rendered else ""
        return recorder, f"asked of {engine.describe()}{fallback}"
    if rendered:
        return recorder, f"{rendered} (the upstream's engine is unknown: {engine.source})"
    return recorder, "none: the upstream's engine is unknown and there is no --tokenizer to render with"


async def _exact(ctx: ProxyContext, counter: TokenCounter | None) -> tuple[ExactMode | None, str]:
    """`--tokens exact`'s state, and its start-up line: the engine's token endpoint, the window that
    bounds a completion, the parsers that turn generated text back into messages (flags, else the
    chat template's family). Raises ValueError naming the flag that settles what it cannot tell."""
    config = ctx.config
    if config.tokens != "exact" or config.upstream is None:
        return None, "off"
    assert counter is not None and ctx.token_ids is not None  # the config requires --tokenizer
    from modeltap.compat.parsers import infer_parsers, reply_parser
    from modeltap.proxy.budget import discover_limits
    from modeltap.proxy.exact import ExactMode

    upstream = ctx.upstream(config.upstream)
    engine = await ctx.token_ids.engine(upstream, _probe_headers(config))
    if ctx.budget is not None:
        context_length: int | None = ctx.budget.limits.context_length
    else:
        context_length = config.context_length or (await discover_limits(upstream, _probe_headers(config)))[0]
    if context_length is None:
        raise ValueError("--tokens exact caps each completion by the context length: give --context-length")
    told = infer_parsers(counter.tokenizer.template.source([{"type": "function"}]))
    tool = config.tool_parser or told.tool_parser
    reasoning = config.reasoning_parser or told.reasoning_parser
    parser = reply_parser(tool, reasoning)
    mode = await asyncio.to_thread(ExactMode, counter, engine, parser, context_length)
    given = "given" if config.tool_parser or config.reasoning_parser else "told by the chat template"
    return mode, (
        f"exact: prompts built with {config.tokenizer} and sent to {engine.describe()} at {mode.path}; "
        f"replies parsed as vLLM's {tool or 'no'} tool parser and {reasoning or 'no'} reasoning parser "
        f"({given}); completions capped by a {context_length}-token window"
    )


def _probe_headers(config: ProxyConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {config.upstream_key}"} if config.upstream_key else {}


async def _expire_sessions(ctx: ProxyContext) -> None:
    """Close idle sessions now and then, so a forgotten token does not live for ever."""
    ttl = ctx.config.session_ttl_s
    while True:
        await asyncio.sleep(min(max(ttl / 4, 1.0), EXPIRY_SWEEP_MAX_S))
        for session_id in ctx.sessions.expire():
            log.info("closed idle session %s", session_id)


async def _health(request: web.Request) -> web.Response:
    """Liveness and the record counters, for anyone who can reach the port: nothing about sessions,
    which are the admin API's business."""
    ctx = request.app[CONTEXT]
    return web.json_response(
        {
            "status": "ok",
            "worker": ctx.setup.index if ctx.setup is not None else 0,
            "records_written": ctx.store.written,
            "record_failures": ctx.store.failures,
            "observer_failures": ctx.observers.failures,
        }
    )


async def _head(request: web.Request) -> web.Response:
    return web.Response(status=200)


def _spans(config: ProxyConfig) -> str:
    endpoint = otlp_traces_endpoint(config)
    if endpoint is None:
        return "not exported (--otlp-endpoint URL exports a span per exchange)"
    return f"{endpoint} ({'with' if config.otlp_content else 'without'} prompts and replies)"


def _base_urls(host: str, port: int) -> tuple[str, str | None]:
    container = network.container_address(host)
    return network.url(network.host_address(host), port), (
        network.url(container, port) if container else None
    )


class _State(enum.Enum):
    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


class Proxy:
    """The proxy app served on its own listener, on the running event loop. new → running → stopped.

    A second start raises; a second stop does nothing; a start that fails halfway unwinds.
    """

    def __init__(
        self,
        config: ProxyConfig,
        observers: Sequence[object] = (),
        writer_observers: Sequence[str] = (),
        setup: WorkerSetup | None = None,
    ) -> None:
        """`observers` see every exchange after the record store and any `config.observers`
        (modeltap.proxy.observers says what an observer is); `writer_observers` name factories
        `MODULE:ATTR` of observers that see each exchange in the record writer process, once it is
        written (serve's line per exchange); `setup` makes it one of `serve --workers N` other than
        the first (workers.py)."""
        self.config = config
        self._setup = setup
        self._observers = tuple(observers)
        self._writer_observers = tuple(writer_observers)
        self.port: int | None = None
        self._state = _State.NEW
        self._stack = contextlib.AsyncExitStack()
        self._app: web.Application | None = None

    async def start(self) -> Proxy:
        """Bind and start serving; `port` then holds the real port (useful with port 0)."""
        if self._state is not _State.NEW:
            raise RuntimeError(f"a Proxy starts once (it is {self._state.value})")
        self._state = _State.RUNNING
        async with contextlib.AsyncExitStack() as stack:
            self._app = build_app(
                self.config, self._base_urls, self._observers, self._writer_observers, self._setup
            )
            runner = listener.runner_for(
                self._app,
                keepalive_timeout_s=self.config.client_timeout_s,
                shutdown_timeout_s=SHUTDOWN_TIMEOUT_S,
            )
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            # Several workers listen on one port, the kernel spreading connections among them.
            shared = self.config.workers > 1 or self._setup is not None
            site = web.TCPSite(
                runner,
                self.config.host,
                self.config.port,
                reuse_address=True,
                reuse_port=shared or None,
                backlog=LISTEN_BACKLOG,
            )
            await site.start()
            self.port = runner.addresses[0][1]
            self._stack = stack.pop_all()
        log.debug("modeltap listening on %s:%s", self.config.host, self.port)
        return self

    async def stop(self) -> None:
        """Stop listening, let running exchanges finish (up to a timeout), flush every record."""
        if self._state is not _State.RUNNING:
            return
        self._state = _State.STOPPED
        await self._stack.aclose()

    async def __aenter__(self) -> Proxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def context(self) -> ProxyContext:
        if self._app is None:
            raise RuntimeError("the Proxy is not started")
        return self._app[CONTEXT]

    @property
    def sessions(self) -> SessionRegistry:
        """The session registry: `proxy.sessions.open(upstream=…, upstream_key=…, labels={…})`."""
        return self.context.sessions

    def report_outcome(self, session_id: str, outcome: RolloutOutcome) -> None:
        """Hand a rollout's outcome to the observers (the store keeps it in the session's row), as
        an "outcome" SessionEvent. Call it before closing the session."""
        session = self.sessions.get(session_id)
        labels, upstream = (dict(session.labels), session.upstream) if session is not None else ({}, None)
        self.context.observers.session(SessionEvent("outcome", session_id, labels, upstream, outcome=outcome))

    @property
    def admin_key(self) -> str:
        """The key the admin API (`/_modeltap/sessions`) requires: configured, or random per start."""
        return self.context.admin_key

    @property
    def host_base_url(self) -> str:
        """The URL a process on this host uses, without `/v1`."""
        return self._base_urls()[0]

    @property
    def container_base_url(self) -> str | None:
        """The URL a container on the default Docker bridge uses, or None on a loopback-only listener."""
        return self._base_urls()[1]

    def _base_urls(self) -> tuple[str, str | None]:
        if self.port is None:
            raise RuntimeError("the Proxy is not started")
        return _base_urls(self.config.host, self.port)


def startup_report(proxy: Proxy, default_session: Session | None, found: str | None = None) -> str:
    """What `modeltap serve` prints at start: where it listens, what it forwards to (and `found`, what
    the upstream answered when asked at start: upstream_check.py), and the base URLs to paste into
    agents running on this host and in Docker containers."""
    config = proxy.config
    # A key the operator chose is theirs to keep: it is printed only when modeltap made it up.
    shown_key = "<the --admin-key you gave>" if config.admin_key else proxy.admin_key
    translated = [
        d.route
        for d in dialects.DIALECTS
        if isinstance(d, ThroughChat) and not serves(config.layout, d.route)
    ]
    lines = [
        f"modeltap listening on {config.host}:{proxy.port}",
        f"  upstream  {config.upstream or '(none: sessions name their own)'}",
        *([f"            {found}"] if found else []),
        f"  layout    {config.layout} ({LAYOUT_HELP[config.layout]})",
        "  translated "
        + (
            "through chat: " + ", ".join(f"/v1/{route}" for route in translated)
            if translated
            else "none" + (" until an endpoint answers 404 at every path" if config.layout == "auto" else "")
        ),
        *(
            [f"  workers   {config.workers} processes serve port {proxy.port}; one record writer beside them"]
            if config.workers > 1
            else []
        ),
        f"  records   {config.store_path.resolve()}",
        f"            follow them: modeltap tail --store {config.store_path.resolve()}",
        f"            browse them: modeltap ui --store {config.store_path.resolve()}",
        f"  spans     {_spans(config)}",
        f"  budget    {proxy.context.budget_report}",
        f"  token ids {proxy.context.token_ids_report}",
        f"  sessions  POST {proxy.host_base_url}/_modeltap/sessions",
        f"            with Authorization: Bearer {shown_key}",
        *textwrap.wrap(naming.RULE, 100, initial_indent="  naming    ", subsequent_indent=" " * 12),
    ]
    base = default_session.host_base_url if default_session else proxy.host_base_url
    container = default_session.container_base_url if default_session else proxy.container_base_url
    if default_session is not None:
        lines.append(
            "  the upstream key is lent only through this session's URLs (it listens beyond loopback):"
        )
    for where, url in (("this host", base), ("a Docker container", container)):
        if url is None:
            lines.append(f"  {where}: unreachable (listening on loopback only; use --host 0.0.0.0)")
            continue
        lines.append(f"  for {where}:")
        lines.append(f"    OpenAI-style clients (opencode, openai SDK)       {url}/v1")
        lines.append(f"    Anthropic-style clients (Claude Code, anthropic)  {url}")
    return "\n".join(lines)
