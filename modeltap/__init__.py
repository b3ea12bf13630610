"""modeltap: a recording, token-budgeting proxy for LLM agent traffic, and the AReaL adapter that
trains a task's own coding agent through it.

The public surface is what `__all__` lists; every other module is internal. Names are imported on
first use, so `import modeltap.adapter` inside AReaL does not load the proxy until a run needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AgentWorkflow": "modeltap.adapter.workflow",
    "Exchange": "modeltap.records.exchange",
    "Proxy": "modeltap.proxy.server",
    "ProxyConfig": "modeltap.proxy.config",
    "task_rows": "modeltap.adapter.workflow",
}
__all__ = ["AgentWorkflow", "Exchange", "Proxy", "ProxyConfig", "__version__", "task_rows"]

if TYPE_CHECKING:
    from modeltap.adapter.workflow import AgentWorkflow, task_rows
    from modeltap.proxy.config import ProxyConfig
    from modeltap.proxy.server import Proxy
    from modeltap.records.exchange import Exchange


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'modeltap' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
