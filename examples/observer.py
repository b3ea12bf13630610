"""An observer of modeltap's exchanges: one JSON line each, on stderr or appended to $MODELTAP_JSONL.

PYTHONPATH=examples modeltap serve --upstream http://127.0.0.1:8000 --observer observer:JsonLines
"""

import json
import os
import sys

from modeltap import Exchange


class JsonLines:
    def __init__(self) -> None:
        path = os.environ.get("MODELTAP_JSONL")
        self.out = open(path, "a", encoding="utf-8") if path else sys.stderr

    def on_exchange(self, ex: Exchange) -> None:
        # Called on the event loop: a short line and no waiting (a slow sink belongs on a thread).
        took_ms = round(((ex.ended or ex.started) - ex.started) * 1000)
        line = {"session": ex.session_id, "endpoint": ex.endpoint, "status": ex.status, "ms": took_ms}
        self.out.write(json.dumps(line | {"error": ex.error_class}) + "\n")
        self.out.flush()
