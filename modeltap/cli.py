"""The `modeltap` command. It parses arguments and calls the library; nothing else lives here.

Every option has one spelling across commands, and `MODELTAP_<OPTION>` in the environment as its
fallback (a flag wins): DESIGN §3.5.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from modeltap import __version__
from modeltap.proxy.config import DEFAULT_STORE, ProxyConfig
from modeltap.proxy.network import is_loopback
from modeltap.proxy.server import Proxy, startup_report
from modeltap.records.store import StoreReader
from modeltap.records.view import session_turns, sessions_table

EPILOG_SERVE = """example:
  modeltap serve --upstream http://10.0.0.5:41235 --port 8080
  # then: opencode baseURL http://127.0.0.1:8080/v1, Claude Code ANTHROPIC_BASE_URL=http://127.0.0.1:8080"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `modeltap` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    # modeltap uses transformers for tokenizers only; its "PyTorch was not found" advice is noise here.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"modeltap {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modeltap", description="Record, budget and route LLM agent traffic; train agents with AReaL."
    )
    parser.add_argument("--version", action="version", version=f"modeltap {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(
        commands, "serve", _serve, "run the recording proxy in front of an upstream", EPILOG_SERVE
    )
    serve.add_argument(
        "--upstream", help="base URL of the OpenAI/Anthropic-compatible server (AReaL, vLLM, …)"
    )
    serve.add_argument(
        "--host", help="address to listen on (default 0.0.0.0: all interfaces, so containers reach it)"
    )
    serve.add_argument("--port", type=int, help="port to listen on (default 0: pick a free one)")
    serve.add_argument(
        "--layout", choices=("areal", "openai", "auto"), help="the upstream's path layout (default auto)"
    )
    serve.add_argument("--upstream-key", help="API key to send upstream instead of the client's")
    serve.add_argument("--model", help="model name that GET /v1/models lists when the upstream has none")
    serve.add_argument(
        "--admin-key", help="key for the admin API /_modeltap/sessions (default: random, printed)"
    )
    serve.add_argument(
        "--admin-remote", action="store_true", default=None, help="serve the admin API beyond loopback too"
    )
    serve.add_argument(
        "--lend-key-to-anonymous",
        action="store_true",
        default=None,
        help="on a non-loopback listener, send --upstream-key for requests without a session token too",
    )
    serve.add_argument("--tokenizer", help="local HF tokenizer folder (or cached name) of the served model")
    serve.add_argument(
        "--context-length", type=int, help="the model's context length (default: ask the upstream)"
    )
    serve.add_argument(
        "--engine-max-tokens", type=int, help="AReaL's rollout.agent.engine_max_tokens, if set"
    )
    serve.add_argument("--reserve", type=int, help="tokens to keep free below the context length (default 0)")
    serve.add_argument(
        "--budget", choices=("clamp", "reject", "off"), help="over-budget policy (default clamp)"
    )
    serve.add_argument("--min-completion-tokens", type=int, help="reject when fewer would remain (default 1)")
    serve.add_argument(
        "--chat-template-kwargs",
        type=json.loads,
        help="""the server's chat template kwargs as JSON, e.g. '{"enable_thinking": false}'""",
    )
    serve.add_argument(
        "--session-ttl", dest="session_ttl_s", type=float, help="idle seconds before a session closes"
    )
    serve.add_argument(
        "--sync", action="store_true", default=None, help="commit each record before its response ends"
    )
    serve.add_argument(
        "--keep-raw-sse", action="store_true", default=None, help="also store streams' raw bytes"
    )
    serve.add_argument("--max-body-bytes", type=int, help="largest request body accepted (default 64 MiB)")
    serve.add_argument("--connect-timeout", dest="connect_timeout_s", type=float, help="seconds (default 10)")
    serve.add_argument(
        "--read-timeout",
        dest="read_timeout_s",
        type=float,
        help="longest upstream silence, seconds (default 3600)",
    )
    _store_option(serve)

    sessions = _command(
        commands, "sessions", _sessions, "list recorded sessions", "example:\n  modeltap sessions --json"
    )
    _store_option(sessions)
    _json_option(sessions)

    show = _command(
        commands, "show", _show, "show a session turn by turn", "example:\n  modeltap show s-3f2a"
    )
    show.add_argument("session", help="session id, or its first characters")
    _store_option(show)
    _json_option(show)

    demo = _command(
        commands,
        "demo",
        _demo,
        "play a scripted agent conversation through modeltap",
        "example:\n  modeltap demo",
    )
    _store_option(demo)
    return parser


def _command(
    commands: Any, name: str, run: Callable[[argparse.Namespace], int], summary: str, epilog: str
) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.set_defaults(run=run)
    return sub


def _store_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", help=f"records database (default $MODELTAP_STORE or {DEFAULT_STORE})")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _store_path(args: argparse.Namespace) -> str:
    return str(args.store or os.environ.get("MODELTAP_STORE") or DEFAULT_STORE)


def _serve(args: argparse.Namespace) -> int:
    flags = {k: v for k, v in vars(args).items() if k not in ("run", "command", "verbose", "json")}
    config = ProxyConfig.from_sources(flags)
    if config.upstream is None:
        raise ValueError("give --upstream URL (or set MODELTAP_UPSTREAM)")
    asyncio.run(_serve_until_signalled(config))
    return 0


async def _serve_until_signalled(config: ProxyConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with Proxy(config) as proxy:
        default = None
        if config.upstream_key and not is_loopback(config.host) and not config.lend_key_to_anonymous:
            default = proxy.sessions.open(session_id="default", labels={"opened_by": "serve"})
        print(startup_report(proxy, default), flush=True)
        await stop.wait()
        print("modeltap: stopping; flushing records", flush=True)


def _sessions(args: argparse.Namespace) -> int:
    with StoreReader(_store_path(args)) as reader:
        rows = reader.sessions()
    print(json.dumps(rows, indent=2) if args.json else sessions_table(rows))
    return 0


def _show(args: argparse.Namespace) -> int:
    with StoreReader(_store_path(args)) as reader:
        matches = reader.session_ids(args.session)
        exact = [m for m in matches if m == args.session]
        if len(exact) != 1 and len(matches) != 1:
            found = ", ".join(matches[:10]) or "none"
            raise ValueError(f"{args.session!r} names {len(matches)} sessions ({found}); give more of the id")
        session_id = exact[0] if exact else matches[0]
        rows = reader.exchanges(session_id)
    print(json.dumps(rows, indent=2) if args.json else session_turns(session_id, rows))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from modeltap.demo import run_demo

    return asyncio.run(run_demo(_store_path(args)))
