"""modeltap/__init__.py: the public surface is exactly `__all__`, each name importable from `modeltap`."""

import subprocess
import sys

import modeltap


def test_all_names_resolve_to_their_objects() -> None:
    from modeltap.adapter.workflow import AgentWorkflow, task_rows
    from modeltap.proxy.config import ProxyConfig
    from modeltap.proxy.server import Proxy
    from modeltap.records.exchange import Exchange

    expected = ["AgentWorkflow", "Exchange", "Proxy", "ProxyConfig", "__version__", "task_rows"]
    assert sorted(modeltap.__all__) == expected
    exported = (
        modeltap.AgentWorkflow,
        modeltap.Exchange,
        modeltap.Proxy,
        modeltap.ProxyConfig,
        modeltap.task_rows,
    )
    assert exported == (AgentWorkflow, Exchange, Proxy, ProxyConfig, task_rows)


def test_importing_the_package_loads_neither_the_proxy_nor_areal() -> None:
    code = (
        "import sys, modeltap; print(sorted(m for m in sys.modules if m.startswith(('modeltap.', 'areal'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
