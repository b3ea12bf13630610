"""ConsoleLog: the line per exchange `modeltap serve` prints on stderr, the same line `modeltap tail`
prints from the store.

Owns: numbering each session's turns as they end, and writing their lines from a thread of its own:
the observer only queues the sealed exchange on the event loop; reading its body (the summary needs
the reply) and writing to a terminal that may be slow happen off it. Does not own: the line's format
(show.py `tail_line`, shared with `tail`), the turn (records/turns.py) or what a format's body says
(its dialect).

    proxy = Proxy(config, observers=[ConsoleLog(sys.stderr)])
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
import time
from collections import OrderedDict
from typing import Any, TextIO

from modeltap.readers.show import tail_line
from modeltap.readers.text import printable
from modeltap.records.exchange import Exchange
from modeltap.records.turns import turn_record

log = logging.getLogger(__name__)

# Lines waiting for the terminal. A terminal that stops reading costs at most this many exchanges'
# lines (counted and said), never the relay's time.
QUEUE_LINES = 10_000
# Sessions whose turn count is kept; an older session's next turn is numbered from 1 again.
SESSIONS_NUMBERED = 10_000
# After writing, the thread sleeps this long before it looks for more lines: a thread asleep is not
# woken by each exchange's put (a futex wake and a switch of the GIL, paid by the relay's loop), and
# lines then appear at most this late, which a reader of the terminal cannot tell.
LINGER_S = 0.05


class ConsoleLog:
    """An observer writing one line per exchange to `out`, from a daemon thread. Not started →
    running → closed; `close` writes what is queued."""

    def __init__(self, out: TextIO, *, verbose: bool = False) -> None:
        self._out = out
        self._verbose = verbose
        # A SimpleQueue, bounded by counting: a put is one C call, where queue.Queue takes a lock and
        # notifies a Condition in Python on every exchange. The loop counts what it queued, the
        # thread what it took; each count has one writer.
        self._queue: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self._queued = 0
        self._taken = 0
        self._turns: OrderedDict[str, int] = OrderedDict()
        self.dropped = 0
        self._thread = threading.Thread(target=self._write_lines, name="modeltap-console", daemon=True)
        self._thread.start()

    def on_exchange(self, exchange: Exchange) -> None:
        if self._queued - self._taken >= QUEUE_LINES:
            self.dropped += 1
            return
        self._queued += 1
        self._queue.put(exchange)

    def close(self) -> None:
        """Write what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()
        if self.dropped:
            self._out.write(
                f"modeltap: {self.dropped} exchange lines were not printed (the terminal was slow)\n"
            )

    def _write_lines(self) -> None:
        stop = False
        while not stop:
            batch = [self._queue.get()]
            # What queued meanwhile goes out in the same write and flush: under load, one system call
            # for many lines instead of two for each.
            while batch[-1] is not None:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is None
            exchanges = [exchange for exchange in batch if exchange is not None]
            self._taken += len(exchanges)
            text = "".join(self._line_or_nothing(exchange) for exchange in exchanges)
            if not text:
                continue
            try:
                self._out.write(text)
                self._out.flush()
            except Exception:  # boundary: lines that cannot be written must not stop the next ones
                log.exception("modeltap: could not print the lines of %d exchanges", len(exchanges))
            if not stop:
                time.sleep(LINGER_S)

    def _line_or_nothing(self, exchange: Exchange) -> str:
        try:
            return self.line(exchange) + "\n"
        except Exception:  # boundary: a line that cannot be made must not stop the next ones
            log.exception("modeltap: could not print the line of exchange %s", exchange.id)
            return ""

    def line(self, exchange: Exchange) -> str:
        """The exchange's line; with `verbose`, its request line and client on a second one."""
        number = self._number(exchange.session_id)
        text = tail_line(turn_record(_row(exchange), number))
        if self._verbose:
            request = f"{exchange.method} {exchange.path}  {exchange.user_agent or ''}".rstrip()
            text += "\n    " + printable(request, lines=False)
        return text

    def _number(self, session: str | None) -> int | None:
        if session is None:
            return None
        number = self._turns.pop(session, 0) + 1
        self._turns[session] = number
        if len(self._turns) > SESSIONS_NUMBERED:
            self._turns.popitem(last=False)
        return number


def to_stderr() -> ConsoleLog:
    """The line per exchange on standard error: what `serve` asks its record writer process to print
    (records/writer_process.py, `WriterOptions.observers`)."""
    return ConsoleLog(sys.stderr)


def to_stderr_verbose() -> ConsoleLog:
    """The same with each request line (`serve -v`)."""
    return ConsoleLog(sys.stderr, verbose=True)


def _row(ex: Exchange) -> dict[str, Any]:
    """The exchange in the shape the store's reader gives a row, for the views."""
    response = ex.response if ex.response is not None else _parsed(ex.response_body)
    return {
        "id": ex.id,
        "seq": None,
        "session_id": ex.session_id,
        "labels": ex.labels,
        "method": ex.method,
        "endpoint": ex.endpoint,
        "path": ex.path,
        "status": ex.status,
        "streamed": ex.streamed,
        "stream_complete": ex.stream_complete,
        "model": None,
        "started": ex.started,
        "first_byte": ex.first_byte,
        "ended": ex.ended,
        "prompt_tokens": None,
        "counted_prompt_tokens": ex.budget.prompt_tokens if ex.budget is not None else None,
        "budget": ex.budget,
        "error_class": ex.error_class,
        "error_message": ex.error_message,
        "user_agent": ex.user_agent,
        "retry_count": ex.retry_count,
        "client_disconnected": ex.client_disconnected,
        # Parsed again in the record writer process, which the exchange reaches as bytes.
        "request": ex.request_json if ex.request_json is not None else _parsed(ex.request),
        "response": response,
    }


def _parsed(body: bytes | None) -> dict[str, Any] | None:
    """A JSON object body, parsed; None for anything else."""
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None
