"""modeltap: a recording, token-budgeting proxy for LLM agent traffic, and the AReaL adapter that
trains a task's own coding agent through it.

The public surface is what `__all__` lists, and `modeltap.testing` (exchanges built for observers'
tests); every other module is internal. The package is typed (py.typed). Names are imported on first
use, so `import modeltap.adapter` inside AReaL does not load the proxy until a run needs it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import TYPE_CHECKING, Any

try:
    # Written once, in pyproject.toml; read from the installed metadata.
    __version__ = importlib.metadata.version("modeltap")
except importlib.metadata.PackageNotFoundError:  # a checkout on sys.path, not installed
    __version__ = "0+unknown"

_EXPORTS = {
    "AgentWorkflow": "modeltap.adapter.workflow",
    "Exchange": "modeltap.records.exchange",
    "ExchangeObserver": "modeltap.proxy.observers",
    "Proxy": "modeltap.proxy.server",
    "ProxyConfig": "modeltap.proxy.config",
    "SessionEvent": "modeltap.records.exchange",
    "SessionObserver": "modeltap.proxy.observers",
    "task_rows": "modeltap.adapter.workflow",
}
__all__ = [
    "AgentWorkflow",
    "Exchange",
    "ExchangeObserver",
    "Proxy",
    "ProxyConfig",
    "SessionEvent",
    "SessionObserver",
    "__version__",
    "task_rows",
]

if TYPE_CHECKING:
    from modeltap.adapter.workflow import AgentWorkflow, task_rows
    from modeltap.proxy.config import ProxyConfig
    from modeltap.proxy.observers import ExchangeObserver, SessionObserver
    from modeltap.proxy.server import Proxy
    from modeltap.records.exchange import Exchange, SessionEvent


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'modeltap' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
