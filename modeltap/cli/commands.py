"""The `modeltap` command. It parses arguments and calls the library; nothing else lives here.

Every option has one spelling across commands, and `MODELTAP_<OPTION>` in the environment as its
fallback (a flag wins). The proxy's flags are generated from ProxyConfig's fields.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import difflib
import errno
import importlib
import io
import json
import logging
import os
import signal
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from types import NoneType
from typing import Any

from aiohttp import web

from modeltap import __version__
from modeltap.cli.completion import SESSION_METAVAR, SHELLS, script
from modeltap.compat import doctor
from modeltap.compat.hosts import is_loopback
from modeltap.exporters.export import FORMATS, send_otlp, write_export
from modeltap.proxy.config import DEFAULT_STORE, ProxyConfig, otlp_traces_endpoint
from modeltap.proxy.network import host_address, url
from modeltap.proxy.server import Proxy, startup_report
from modeltap.proxy.upstream_check import upstream_found
from modeltap.proxy.workers import start_workers
from modeltap.readers import console as console_module
from modeltap.readers.console import ConsoleLog
from modeltap.readers.diff import compare, diff_text, side
from modeltap.readers.grep import compile_pattern, hit_line, search
from modeltap.readers.sessions import groups_table, sessions_table
from modeltap.readers.show import session_turns, turn_text
from modeltap.readers.stats import covered, stats, stats_table
from modeltap.readers.tail import follow
from modeltap.readers.terminal import colour_wanted, emit, say
from modeltap.readers.ui import viewer_app
from modeltap.records.exchange import OUTCOMES
from modeltap.records.jsontext import pretty
from modeltap.records.prune import needs_full_vacuum, prune, vacuum
from modeltap.records.query import DEFAULT_GROUP_LABEL, DEFAULT_LIMIT, SessionQuery, parse_label, parse_when
from modeltap.records.reader import StoreReader
from modeltap.records.stores import Stores, expand, patterns_from, reader_patterns, remember_store
from modeltap.records.turns import turns
from modeltap.replay.mock import load_mock, mock_app
from modeltap.replay.replay import comparison_text, replay

EPILOG_SERVE = """example:
  modeltap serve --upstream http://10.0.0.5:41235 --port 8080
  # then: opencode baseURL http://127.0.0.1:8080/v1, Claude Code ANTHROPIC_BASE_URL=http://127.0.0.1:8080"""

EPILOG_SESSIONS = """examples:
  modeltap sessions                    the newest 50: turns, tokens, errors, reward, outcome
  modeltap sessions --label task_id=fix-bug --outcome failed --since 2h
  modeltap sessions --store 'nodes/*/records.db' --all --json    every node's sessions, for scripts"""
EPILOG_GROUPS = """examples:
  modeltap groups                   one line per task: samples, mean reward, share of each outcome
  modeltap groups --label agent     the same, per agent"""
EPILOG_DIFF = """example:
  modeltap diff s-3f2a s-9c1e       where a failed and a passed sample of one task part ways
exit status 0 when the model traffic is the same, 1 when it differs, 2 on error (as diff)"""
EPILOG_PRUNE = """examples:
  modeltap prune --before 7d --dry-run              what would go: the sessions, exchanges and bytes
  modeltap prune --before 7d                        sessions last active more than a week ago
  modeltap prune --keep-last 1000 --label experiment=grpo-7
safe while `modeltap serve` writes; then `modeltap vacuum` gives the space back"""
EPILOG_VACUUM = """example:
  modeltap vacuum --store .modeltap/records.db"""
EPILOG_SHOW = """examples:
  modeltap show s-3f2a              every turn: new messages, tool calls and results, reply, tokens, timing
  modeltap show s-3f2a 4 --full     turn 4 in full, with its request and response bodies
  modeltap show s-3f2a --json       the turns as JSON"""
EPILOG_TAIL = """example (in a second terminal while `modeltap serve` runs):
  modeltap tail --session s-3f2a"""
EPILOG_EXPORT = """examples:
  modeltap export s-3f2a --format har -o run.har      open in Chrome DevTools (Network > Import HAR)
  modeltap export s-3f2a --format jsonl               one exchange per line, with "format_version"
  modeltap export s-3f2a --format messages >> sft.jsonl   the final conversation and its tools
  modeltap export s-3f2a --format tokens              token ids and loss mask per continuous stretch
  modeltap export --all --format tokens -o train.jsonl      every session recorded with serve --token-ids
  modeltap export --all --format otlp --otlp-endpoint http://collector:4318   spans, at their times"""
EPILOG_REPLAY = """example:
  modeltap replay s-3f2a --upstream http://127.0.0.1:8000 --turn 3
the replay is recorded as a new session labelled replay_of=SESSION; exit status 1 when a turn differs"""
EPILOG_MOCK = """examples:
  modeltap mock --session s-3f2a --port 9000
  # then point the agent at http://127.0.0.1:9000/v1 (OpenAI-style) or http://127.0.0.1:9000 (Anthropic)
  modeltap mock --session s-3f2a --strict   a test fixture: an off-script request gets a 409
each request is logged on stderr with how it matched (exact #3, next in order #4 (diverged at ...));
GET /_modeltap/mock says what was served, POST /_modeltap/mock/reset starts the session over"""
EPILOG_GREP = """examples:
  modeltap grep Traceback                     which turn of which session saw a traceback
  modeltap grep -i 'rm -rf' --label task_id=fix-bug --all     in tool calls too, every session
  modeltap grep 'rate.?limit' --errors --json                 the hits as JSON, for scripts
one line per hit: SESSION #TURN role: the text around the match; exit status 0 when something matched,
1 when nothing did, 2 on error (as grep)"""
EPILOG_STATS = """examples:
  modeltap stats                          finish reasons, error classes, token p50/p90/p99 (newest 50)
  modeltap stats --label task_id --all    one row per task, over every session
  modeltap stats --label agent --label experiment=grpo-7 --json
--label K (no =) groups by that label; --label K=V filters, as in sessions"""
EPILOG_DEMO = """examples:
  modeltap demo                      a scripted model, modeltap in front, a tool-using conversation
  modeltap demo --model-only         no model server yet? the scripted model on 127.0.0.1:8000, then:
  modeltap serve --upstream http://127.0.0.1:8000"""
# The sessions a dry run names, newest first, before "… and N more".
DRY_RUN_LISTED = 20
# `demo --model-only` listens where the quickstart's `serve --upstream` looks: vLLM's default port.
DEMO_MODEL_PORT = 8000
EPILOG_UI = """example:
  modeltap ui --port 8765          then open the printed URL; it updates live while `serve` records"""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `modeltap` console script."""
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # argparse hands a subcommand's leftovers to the top-level parser, whose usage says nothing
        # of the subcommand's flags: the subcommand's own parser says it, with the closest flag.
        args.parser.error(_unknown_arguments(args.parser, unknown))
    # Records keep what agents sent, a lone surrogate included: printed as its escape, never a crash.
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
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
    except BrokenPipeError:  # `modeltap export … | head`: the reader has all it wanted
        return 0


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
    _config_flags(serve)
    serve.add_argument("--quiet", action="store_true", help="no line per exchange on stderr")
    serve.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="more: each request line too"
    )

    sessions = _command(
        commands, "sessions", _sessions, "list recorded sessions, newest first", EPILOG_SESSIONS
    )
    _filter_options(sessions)
    _store_option(sessions)
    _json_option(sessions)
    sessions.add_argument("--ids", action="store_true", help="only the ids, one a line (what TAB completes)")

    groups = _command(
        commands,
        "groups",
        _groups,
        "sessions grouped by a label: rewards and outcomes per task",
        EPILOG_GROUPS,
    )
    groups.add_argument(
        "--label", default=DEFAULT_GROUP_LABEL, help=f"the label to group by (default {DEFAULT_GROUP_LABEL})"
    )
    _store_option(groups)
    _json_option(groups)

    grep = _command(
        commands,
        "grep",
        _grep,
        "search messages, tool calls and errors across sessions for a regular expression",
        EPILOG_GREP,
    )
    grep.add_argument("pattern", help="a Python regular expression (-F: literal text)")
    grep.add_argument("-i", "--ignore-case", action="store_true", help="match upper and lower case alike")
    grep.add_argument("-F", "--fixed-strings", action="store_true", help="PATTERN is literal text")
    _filter_options(grep)
    _store_option(grep)
    _json_option(grep)

    stats_ = _command(
        commands,
        "stats",
        _stats,
        "finish reasons, error classes and token percentiles per exchange, per value of a label",
        EPILOG_STATS,
    )
    _filter_options(stats_, group_by=True)
    _store_option(stats_)
    _json_option(stats_)

    show = _command(commands, "show", _show, "show a session turn by turn: what each turn added", EPILOG_SHOW)
    show.add_argument("session", metavar=SESSION_METAVAR, help="session id, or its first characters")
    show.add_argument("turn", nargs="?", type=int, help="one turn (from 1), shown in full")
    show.add_argument("--full", action="store_true", help="with the full request and response bodies")
    _store_option(show)
    _json_option(show)

    diff = _command(commands, "diff", _diff, "where two sessions part ways, turn by turn", EPILOG_DIFF)
    diff.add_argument("a", metavar=SESSION_METAVAR, help="a session id, or its first characters")
    diff.add_argument("b", metavar=SESSION_METAVAR, help="the session to compare it with")
    _store_option(diff)
    _json_option(diff)

    tail = _command(commands, "tail", _tail, "follow exchanges live as they are recorded", EPILOG_TAIL)
    tail.add_argument(
        "--session", metavar=SESSION_METAVAR, help="only this session (id, or its first characters)"
    )
    tail.add_argument(
        "-n", "--lines", type=int, default=10, help="recorded exchanges to print first (default 10)"
    )
    _store_option(tail)
    _json_option(tail)

    export = _command(
        commands,
        "export",
        _export,
        "write a session as HAR, JSON lines, SFT messages or token ids, or send it to a tracing backend",
        EPILOG_EXPORT,
    )
    export.add_argument(
        "session", nargs="?", metavar=SESSION_METAVAR, help="session id, or its first characters"
    )
    export.add_argument("--all", action="store_true", help="every session, one after another (all but har)")
    export.add_argument("--format", choices=FORMATS, default="har", help="output format (default har)")
    export.add_argument("-o", "--output", help="file to write (default stdout)")
    _config_flags(export, ("otlp_endpoint", "otlp_content"))
    _store_option(export)

    replay_ = _command(
        commands, "replay", _replay, "re-send a session to another upstream and compare", EPILOG_REPLAY
    )
    replay_.add_argument("session", metavar=SESSION_METAVAR, help="session id, or its first characters")
    _config_flags(replay_, ("upstream", "layout", "upstream_key"))
    replay_.add_argument("--turn", type=int, help="only this turn (from 1)")
    _store_option(replay_)
    _json_option(replay_)

    mock = _command(
        commands, "mock", _mock, "serve recorded responses as a deterministic upstream", EPILOG_MOCK
    )
    mock.add_argument(
        "--session",
        metavar=SESSION_METAVAR,
        help="serve this session in turn order (default: every session, exact bodies)",
    )
    mock.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    mock.add_argument("--port", type=int, default=0, help="port to listen on (default 0: pick a free one)")
    mock.add_argument("--realtime", action="store_true", help="answer at the recorded pace")
    mock.add_argument(
        "--strict",
        action="store_true",
        help="serve exact matches only: any other request gets a 409 saying where it diverged",
    )
    mock.add_argument("--quiet", action="store_true", help="no line per request on stderr")
    _config_flags(mock, ("max_body_bytes",))
    _store_option(mock)

    ui = _command(commands, "ui", _ui, "browse recorded sessions in a local web viewer", EPILOG_UI)
    ui.add_argument("--port", type=int, default=0, help="port to listen on (default 0: pick a free one)")
    _store_option(ui)

    prune_ = _command(
        commands, "prune", _prune, "delete old sessions and the records only they hold", EPILOG_PRUNE
    )
    which = prune_.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--before", help="sessions last active before this: an ISO time, or a duration ago (7d)"
    )
    which.add_argument(
        "--keep-last", type=int, metavar="N", help="keep the newest N sessions, delete the rest"
    )
    prune_.add_argument(
        "--label", action="append", metavar="K=V", help="only sessions with this label; repeatable"
    )
    prune_.add_argument(
        "--dry-run", action="store_true", help="delete nothing: say which sessions and how much would go"
    )
    _store_option(prune_)

    vacuum_ = _command(
        commands, "vacuum", _vacuum, "give the space pruned records held back to the disk", EPILOG_VACUUM
    )
    _store_option(vacuum_)

    doctor_ = _command(
        commands,
        "doctor",
        _doctor,
        "check an AReaL experiment config for the pitfalls that cost GPU days",
        "example:\n  modeltap doctor grpo.yaml ++rollout.agent.admin_api_key=$KEY --gpu-memory-gb 24",
    )
    # Options between the overrides (`doctor cfg.yaml a=1 --json b=2`): argparse gives no other way to
    # choose one subcommand's parser class.
    doctor_.__class__ = _IntermixedParser
    _doctor_arguments(doctor_)

    demo = _command(
        commands,
        "demo",
        _demo,
        "play a scripted agent conversation through modeltap, or serve only its scripted model",
        EPILOG_DEMO,
    )
    demo.add_argument(
        "--model-only",
        action="store_true",
        help="serve the scripted model alone, as a model server for modeltap serve to front",
    )
    demo.add_argument(
        "--port",
        type=int,
        help=f"with --model-only: the port to listen on (default {DEMO_MODEL_PORT}; 0 picks a free one)",
    )
    demo.add_argument(
        "--host", default="127.0.0.1", help="with --model-only: the address to listen on (default 127.0.0.1)"
    )
    _store_option(demo, several=False)

    completion = _command(
        commands,
        "completion",
        _completion,
        "print a shell completion script for bash or zsh",
        'examples:\n  eval "$(modeltap completion bash)"     in ~/.bashrc\n'
        '  eval "$(modeltap completion zsh)"      in ~/.zshrc, after compinit',
    )
    completion.add_argument("shell", choices=SHELLS)
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
    sub.set_defaults(run=run, parser=sub)
    return sub


def _unknown_arguments(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """argparse's words for arguments nobody took, with the closest flag of `parser` for a mistyped one."""
    message = f"unrecognized arguments: {' '.join(unknown)}"
    flags = [flag for action in parser._actions for flag in action.option_strings]
    typed = next((arg.partition("=")[0] for arg in unknown if arg.startswith("--")), None)
    close = difflib.get_close_matches(typed, flags, n=1) if typed else []
    return message + (f" (did you mean {close[0]}?)" if close else "")


def _config_flags(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """ProxyConfig's fields as flags (`names` only, else all): one spelling and help for each, in
    every command that takes it. A flag left out is None, so the environment or the default fills it."""
    hints = typing.get_type_hints(ProxyConfig)
    for field in dataclasses.fields(ProxyConfig):
        if names is not None and field.name not in names:
            continue
        flag = field.metadata["flag"] or "--" + field.name.replace("_", "-")
        options: dict[str, Any] = {"dest": field.name, "help": field.metadata["help"], "default": None}
        kind = _without_none(hints[field.name])
        if kind is bool:
            options["action"] = "store_true"
        elif typing.get_origin(kind) is list:
            options |= {"action": "append", "metavar": flag[2:].upper().replace("-", "_")}
        elif typing.get_origin(kind) is typing.Literal:
            options["choices"] = typing.get_args(kind)
        elif typing.get_origin(kind) is dict:
            options |= {"type": json.loads, "metavar": "JSON"}
        else:
            options |= {"type": kind, "metavar": flag[2:].upper().replace("-", "_")}
        parser.add_argument(flag, **options)


def _without_none(hint: Any) -> Any:
    """`X` of `X | None`, else the hint itself."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(arg for arg in typing.get_args(hint) if arg is not NoneType)
    return hint


def _store_option(parser: argparse.ArgumentParser, *, several: bool = True) -> None:
    if not several:
        parser.add_argument("--store", help=f"records database (default $MODELTAP_STORE or {DEFAULT_STORE})")
        return
    parser.add_argument(
        "--store",
        action="append",
        help=f"records database; repeatable, globs too (default $MODELTAP_STORE, which may list several "
        f"separated by {os.pathsep!r}, or {DEFAULT_STORE})",
    )


def _filter_options(parser: argparse.ArgumentParser, *, group_by: bool = False) -> None:
    """`sessions`' filters: they combine. With `group_by`, a `--label K` without `=` names the label
    to group by."""
    parser.add_argument(
        "--label",
        action="append",
        metavar="K=V" if not group_by else "K[=V]",
        help="only sessions with this label; repeatable"
        + ("; K alone: one row per value of K (task_id, agent)" if group_by else ""),
    )
    parser.add_argument("--outcome", choices=OUTCOMES, help="only rollouts that ended so")
    parser.add_argument("--errors", action="store_true", help="only sessions with an exchange that failed")
    parser.add_argument("--since", help="started at or after this: an ISO time, or a duration ago (2h, 7d)")
    parser.add_argument("--until", help="started before this: an ISO time, or a duration ago")
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"at most N sessions, newest first (default {DEFAULT_LIMIT})",
    )
    parser.add_argument("--all", action="store_true", help="every session (no --limit)")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def _store_path(args: argparse.Namespace) -> str:
    """The one store a writing command works on."""
    return str(args.store or os.environ.get("MODELTAP_STORE") or DEFAULT_STORE)


def _store_patterns(args: argparse.Namespace) -> list[str]:
    """What names the stores a reader reads: `--store` (repeatable, globs), else MODELTAP_STORE, else
    the default if it is here, else the store the last `modeltap serve` wrote to (said on stderr)."""
    patterns, last = reader_patterns(args.store, os.environ, DEFAULT_STORE)
    if last is not None:
        print(f"reading {last} (the store the last modeltap serve wrote)", file=sys.stderr)
    return patterns


def _prune_patterns(args: argparse.Namespace) -> list[str]:
    """The stores prune and vacuum change: only those named, or the default, never a remembered one."""
    return patterns_from(args.store, os.environ, DEFAULT_STORE)


def _stores(args: argparse.Namespace) -> Stores:
    """The stores a reader reads; each one skipped among several is said in one line on stderr."""
    stores = Stores.open(_store_patterns(args))
    for line in stores.refused:
        print(f"modeltap {args.command}: {line}", file=sys.stderr)
    return stores


def _serve(args: argparse.Namespace) -> int:
    skipped = ("run", "command", "verbose", "json", "quiet")
    config = ProxyConfig.from_sources({k: v for k, v in vars(args).items() if k not in skipped})
    if config.upstream is None:
        raise ValueError("give --upstream URL (or set MODELTAP_UPSTREAM)")
    # The line per exchange is printed by the record writer process, beside serve, where it costs the
    # relay nothing; with --record-writer thread, by a thread of serve's.
    lines = not args.quiet and config.record_writer == "process"
    beside = [f"{console_module.__name__}:to_stderr{'_verbose' if args.verbose else ''}"] if lines else []
    console = None if args.quiet or lines else ConsoleLog(sys.stderr, verbose=args.verbose)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(config.event_loop)) as runner:
            runner.run(_serve_until_signalled(config, [console] if console else [], beside))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {config.port} is in use: give another with --port N (--port 0 picks a free one)"
            ) from None
        raise ValueError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    finally:
        if console is not None:
            console.close()
    return 0


async def _serve_until_signalled(
    config: ProxyConfig, observers: Sequence[object], writer_observers: Sequence[str]
) -> None:
    stop = _stop_on_signals()
    async with Proxy(config, observers=observers, writer_observers=writer_observers) as proxy:
        await asyncio.to_thread(_remember_store, config.store)
        default = None
        if config.upstream_key and not is_loopback(config.host) and not config.lend_key_to_anonymous:
            default = proxy.sessions.open(session_id="default", labels={"opened_by": "serve"})
        async with contextlib.AsyncExitStack() as workers:
            if config.workers > 1:
                await workers.enter_async_context(start_workers(proxy))
            # Asked once, briefly: a mistake shows now, and an upstream that is not up yet fails nothing.
            found = await upstream_found(proxy.context)
            print(startup_report(proxy, default, found), flush=True)
            await stop.wait()
            print("modeltap: stopping; flushing records", flush=True)


def _loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """serve's event loop: uvloop's when asked for or (auto) installed, else asyncio's (None)."""
    if choice == "asyncio":
        return None
    try:
        uvloop = importlib.import_module("uvloop")  # the `fast` extra; untyped where it is absent
    except ImportError:
        if choice == "uvloop":
            raise ValueError("--event-loop uvloop needs uvloop: pip install 'modeltap[fast]'") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _remember_store(store: str) -> None:
    """Leave the store's path where a reader started elsewhere finds it. A home that cannot be written
    costs that convenience only: serving goes on."""
    try:
        remember_store(store, os.environ)
    except OSError as exc:
        logging.getLogger(__name__).warning("cannot note the store for readers started elsewhere: %s", exc)


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM. A plain signal handler, not `loop.add_signal_handler`: that one
    learns of a signal through asyncio's self-pipe, which a burst of wake-ups can fill, dropping it."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: loop.call_soon_threadsafe(stop.set))
    return stop


def _session_query(args: argparse.Namespace, labels: Sequence[str] | None = None) -> SessionQuery:
    """The SessionQuery of `_filter_options` (`labels`: the K=V filters, when not all of --label)."""
    return SessionQuery(
        labels=tuple(parse_label(label) for label in (args.label or () if labels is None else labels)),
        outcome=args.outcome,
        errors=args.errors,
        since=parse_when(args.since) if args.since else None,
        until=parse_when(args.until) if args.until else None,
        limit=None if args.all else args.limit,
        unsessioned=True,
    )


def _sessions(args: argparse.Namespace) -> int:
    query = _session_query(args)
    with _stores(args) as stores:
        rows, several = stores.sessions(query), stores.several
    if args.ids:
        say("\n".join(dict.fromkeys(row["id"] for row in rows)))
        return 0
    if args.json:
        print(pretty(rows))
        return 0
    say(sessions_table(rows, with_store=several))
    if query.limit is not None and len(rows) == query.limit:
        print(f"(the newest {query.limit}; --limit N or --all for more)")
    return 0


def _stats(args: argparse.Namespace) -> int:
    group_by = [label for label in args.label or () if "=" not in label]
    if len(group_by) > 1:
        raise ValueError(f"stats groups by one label, not {len(group_by)}: give one --label K without =")
    query = _session_query(args, [label for label in args.label or () if "=" in label])
    with _stores(args) as stores:
        chosen = stores.selected(query)
        limited = query.limit is not None and len(chosen) == query.limit
        covers = covered(len(chosen), stores.count(query) if limited else len(chosen))
        groups = stats(chosen, group_by[0] if group_by else None, covers)
    say(pretty(groups) if args.json else stats_table(groups))
    if limited:
        print(f"(over {covers}; --limit N or --all for more)", file=sys.stderr)
    return 0


def _grep(args: argparse.Namespace) -> int:
    pattern = compile_pattern(args.pattern, ignore_case=args.ignore_case, fixed=args.fixed_strings)
    query = _session_query(args)
    highlight = sys.stdout.isatty() and colour_wanted(os.environ)
    hits = 0
    with _stores(args) as stores:
        chosen = stores.selected(query)
        found = search(chosen, pattern)
        if args.json:
            listed = list(found)
            hits = len(listed)
            print(pretty(listed))
        else:
            for hit in found:
                hits += 1
                print(hit_line(hit, with_store=stores.several, highlight=highlight), flush=hits % 100 == 0)
    if query.limit is not None and len(chosen) == query.limit:
        print(f"(searched the newest {query.limit} sessions; --limit N or --all for more)", file=sys.stderr)
    return 0 if hits else 1


def _groups(args: argparse.Namespace) -> int:
    with _stores(args) as stores:
        rows = stores.groups(args.label)
    say(pretty(rows) if args.json else groups_table(rows))
    return 0


def _diff(args: argparse.Namespace) -> int:
    with _stores(args) as stores:
        result = compare(side(stores, args.a), side(stores, args.b))
    say(pretty(result) if args.json else diff_text(result))
    return 1 if result["differs"] else 0


def _prune(args: argparse.Namespace) -> int:
    labels = [parse_label(label) for label in args.label or ()]
    before = parse_when(args.before) if args.before else None
    for path in expand(_prune_patterns(args)):
        freed = prune(path, before=before, keep_last=args.keep_last, labels=labels, dry_run=args.dry_run)
        print(f"{path}: {freed.text()}")
        shown = freed.session_ids[:DRY_RUN_LISTED]
        more = len(freed.session_ids) - len(shown)
        if shown:
            say(
                "\n".join(
                    [
                        *(f"  {session_id}" for session_id in shown),
                        *([f"  … and {more} more"] if more else []),
                    ]
                )
            )
    return 0


def _vacuum(args: argparse.Namespace) -> int:
    for path in expand(_prune_patterns(args)):
        if path.exists() and needs_full_vacuum(path):
            print(
                f"{path} predates incremental vacuuming: this rewrites it in one pass, holding its write "
                "lock throughout (stop `modeltap serve` first); later vacuums go in small steps",
                file=sys.stderr,
            )
        print(f"{path}: {vacuum(path).text()}")
    return 0


def _show(args: argparse.Namespace) -> int:
    with _stores(args) as stores:
        reader, session_id = stores.resolve(args.session)
        rows, session = reader.exchanges(session_id), reader.session(session_id)
        tokens = reader.token_turns(session_id)
    listed = turns(rows, full=args.full, tokens=tokens)
    if args.turn is not None:
        if not 1 <= args.turn <= len(listed):
            raise ValueError(f"session {session_id} has turns 1..{len(listed)}, not {args.turn}")
        turn = listed[args.turn - 1]
        if args.json:
            print(pretty(turn.as_json()))
        else:
            emit(turn_text(turn, rows[args.turn - 1]["request"]))
    elif args.json:
        print(pretty([turn.as_json() for turn in listed]))
    else:
        emit(
            "\n\n".join(turn_text(t) for t in listed)
            if args.full
            else session_turns(session_id, rows, session, tokens=tokens)
        )
    return 0


def _tail(args: argparse.Namespace) -> int:
    follow(expand(_store_patterns(args)), session=args.session, history=args.lines, as_json=args.json)
    return 0


def _export(args: argparse.Namespace) -> int:
    with _stores(args) as stores:
        chosen = _export_sessions(stores, args)
        if args.format == "otlp":
            return _send_otlp(chosen, args)
        if args.output is None:
            skipped = _write_sessions(chosen, args, sys.stdout)
        else:
            skipped = _write_whole(Path(args.output), lambda out: _write_sessions(chosen, args, out))
    if args.output is not None or skipped:
        what = f"session {chosen[0][1]}" if not args.all else f"{len(chosen) - len(skipped)} session(s)"
        where = f" to {args.output}" if args.output is not None else ""
        nothing = f" ({len(skipped)} had nothing to export as {args.format})" if skipped else ""
        print(f"wrote {what} as {args.format}{where}{nothing}", file=sys.stderr)
    return 0


def _export_sessions(stores: Stores, args: argparse.Namespace) -> list[tuple[StoreReader, str]]:
    """The sessions an export covers, each with its store: the one named, or with `--all` every one
    in every store. (The seam for the filters `sessions` takes: they narrow this list.)"""
    if args.all == (args.session is not None):
        raise ValueError("give a SESSION or --all")
    if not args.all:
        return [stores.resolve(args.session)]
    if args.format == "har":
        raise ValueError("a HAR holds one session: name it, or give --all with another --format")
    return [(reader, session["id"]) for reader in stores.readers for session in reader.sessions()]


def _write_whole(path: Path, write: Callable[[typing.TextIO], list[str]]) -> list[str]:
    """`write` into `path` whole or not at all: into a file beside it, renamed over it once `write`
    returned, so an export that fails (a session with nothing of the format) leaves no empty or
    half-written file, and an earlier file of that name as it was."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as out:
            written = write(out)
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return written


def _write_sessions(
    chosen: list[tuple[StoreReader, str]], args: argparse.Namespace, out: typing.TextIO
) -> list[str]:
    """Write each session; with `--all`, one holding nothing of the format is skipped (and returned)."""
    skipped = []
    for reader, session_id in chosen:
        try:
            write_export(reader, session_id, args.format, out)
        except ValueError:
            if not args.all:
                raise
            skipped.append(session_id)
    return skipped


def _send_otlp(chosen: list[tuple[StoreReader, str]], args: argparse.Namespace) -> int:
    config = ProxyConfig.from_sources(
        {"otlp_endpoint": args.otlp_endpoint, "otlp_content": args.otlp_content}
    )
    endpoint = otlp_traces_endpoint(config)
    if endpoint is None:
        raise ValueError("--format otlp needs --otlp-endpoint URL (or OTEL_EXPORTER_OTLP_ENDPOINT)")
    sent = send_otlp(chosen, endpoint, content=config.otlp_content)
    print(f"sent {sent} spans of {len(chosen)} session(s) to {endpoint}", file=sys.stderr)
    return 0


def _replay(args: argparse.Namespace) -> int:
    with _stores(args) as stores:
        reader, session_id = stores.resolve(args.session)
        store = str(reader.path)
    flags = {"upstream": args.upstream, "layout": args.layout, "upstream_key": args.upstream_key}
    config = ProxyConfig.from_sources(flags | {"store": store, "host": "127.0.0.1", "port": 0, "sync": True})
    if config.upstream is None:
        raise ValueError("give --upstream URL (or set MODELTAP_UPSTREAM)")
    replayed, comparisons = asyncio.run(_replay_through_proxy(config, session_id, args.turn))
    if args.json:
        print(json.dumps({"session": session_id, "replay_session": replayed, "turns": comparisons}, indent=2))
    else:
        say(comparison_text(comparisons) + f"\nrecorded as session {replayed}: modeltap show {replayed}")
    return 1 if any(c["differs"] for c in comparisons) else 0


async def _replay_through_proxy(
    config: ProxyConfig, session_id: str, turn: int | None
) -> tuple[str, list[dict[str, Any]]]:
    """The replay goes through a modeltap Proxy, which lays out paths for the upstream, assembles
    streams and records each replayed exchange in a session of its own."""
    async with Proxy(config) as proxy:
        session = proxy.sessions.open(labels={"replay_of": session_id})
        comparisons = await replay(
            config.store, session_id, session.host_base_url, replay_session=session.id, turn=turn
        )
    return session.id, comparisons


def _mock(args: argparse.Namespace) -> int:
    with _stores(args) as stores:
        if args.session:
            reader, session_id = stores.resolve(args.session)
        elif stores.several:
            raise ValueError("without --session, mock serves one store: give one --store")
        else:
            reader, session_id = stores.readers[0], None
        store = str(reader.path)
    mock = load_mock(store, session=session_id, realtime=args.realtime, strict=args.strict)
    what = f"session {session_id} in turn order" if session_id else "every session, matched by request body"
    strict = ", strict: off-script requests get a 409" if args.strict else ""
    banner = f"modeltap mock: {len(mock.recorded)} recorded exchange(s) of {what}{strict}"
    max_body_bytes = ProxyConfig.from_sources({"max_body_bytes": args.max_body_bytes}).max_body_bytes
    log = None if args.quiet else lambda line: print(line, file=sys.stderr, flush=True)
    app = mock_app(mock, max_body_bytes, log, bind_host=args.host)
    asyncio.run(_serve_app_until_signalled(app, args.host, args.port, banner))
    return 0


def _ui(args: argparse.Namespace) -> int:
    patterns = _store_patterns(args)
    banner = f"modeltap ui: {', '.join(patterns)}"
    asyncio.run(_serve_app_until_signalled(viewer_app(patterns), "127.0.0.1", args.port, banner))
    return 0


async def _serve_app_until_signalled(
    app: web.Application, host: str, port: int, banner: str, footer: Callable[[str], str] | None = None
) -> None:
    """Serve `app` until SIGINT or SIGTERM, having printed `banner`, the URL it listens on, and
    `footer(url)` when given."""
    stop = _stop_on_signals()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        listening = url(host_address(host), runner.addresses[0][1])
        print(f"{banner}\n  listening on {listening}", flush=True)
        if footer is not None:
            print(footer(listening), flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


class _IntermixedParser(argparse.ArgumentParser):
    """A subcommand's parser that takes its options anywhere among its positionals. A subcommand is
    parsed by `parse_known_args`, which stops filling positionals at the first option; this one routes
    that call to `parse_known_intermixed_args` (which itself calls `parse_known_args`, plainly)."""

    _intermixing = False

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def _doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """config, overrides..., --json, --gpu-memory-gb, --chat-template-kwargs; the
    options may come anywhere among the config and the overrides."""
    parser.add_argument("config", help="the AReaL experiment YAML")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: a.b=c, +a.b=c, ++a.b=c, ~a.b")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--gpu-memory-gb", type=float, help="one training GPU's memory, to check small-GPU settings"
    )
    parser.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        help="the chat_template_kwargs modeltap's token counter gets, as JSON, if not in the config",
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, such as '{\"enable_thinking\": false}'")
    return value


def _doctor(args: argparse.Namespace) -> int:
    findings = doctor.check(
        doctor.load_config(args.config, args.overrides),
        env=os.environ,
        bundle_tasks=_bundle_tasks,
        gpu_memory_gb=args.gpu_memory_gb,
        token_counter_kwargs=args.chat_template_kwargs,
    )
    print(doctor.render(findings, args.json))
    return doctor.exit_code(findings)


def _bundle_tasks(path: str) -> dict[str, float]:
    """{task id: timeout} of a bundle, for doctor (compat cannot import the adapter)."""
    from modeltap.adapter import load_bundle

    return {task.id: task.timeout_s for task in load_bundle(path).tasks.values()}


def _completion(args: argparse.Namespace) -> int:
    print(script(_parser(), args.shell), end="")
    return 0


def _demo(args: argparse.Namespace) -> int:
    if args.model_only:
        return _demo_model(args)
    if args.port is not None:
        raise ValueError("--port goes with --model-only (the demo itself listens on free ports)")
    from modeltap.demo.play import run_demo

    return asyncio.run(run_demo(_store_path(args)))


def _demo_model(args: argparse.Namespace) -> int:
    from modeltap.demo.model import MODEL_BANNER, model_app, next_steps

    port = DEMO_MODEL_PORT if args.port is None else args.port
    try:
        asyncio.run(_serve_app_until_signalled(model_app(), args.host, port, MODEL_BANNER, next_steps))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {port} is in use: give another with --port N (--port 0 picks a free one)"
            ) from None
        raise ValueError(f"cannot listen on {args.host}:{port}: {exc.strerror or exc}") from None
    return 0
