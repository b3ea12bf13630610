"""modeltap/__init__.py: the public surface is exactly `__all__`, each name importable from `modeltap`."""

import subprocess
import sys

import modeltap


def test_all_names_resolve_to_their_objects() -> None:
    from modeltap.adapter.workflow import AgentWorkflow, task_rows
    from modeltap.proxy.config import ProxyConfig
    from modeltap.proxy.observers import ExchangeObserver, SessionObserver
    from modeltap.proxy.server import Proxy
    from modeltap.records.exchange import Exchange, SessionEvent

    expected = [
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
    assert sorted(modeltap.__all__) == expected
    exported = tuple(getattr(modeltap, name) for name in expected if name != "__version__")
    objects = (
        AgentWorkflow,
        Exchange,
        ExchangeObserver,
        Proxy,
        ProxyConfig,
        SessionEvent,
        SessionObserver,
        task_rows,
    )
    assert exported == objects


def test_importing_the_package_loads_neither_the_proxy_nor_areal() -> None:
    code = (
        "import sys, modeltap; print(sorted(m for m in sys.modules if m.startswith(('modeltap.', 'areal'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_version_is_the_installed_metadata_written_once() -> None:
    import importlib.metadata
    import re
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert modeltap.__version__ == importlib.metadata.version("modeltap") == pyproject["project"]["version"]
    number = re.escape(pyproject["project"]["version"])
    assert not re.search(rf"[\"']{number}[\"']", Path(modeltap.__file__).read_text())  # no second copy


def test_a_users_mypy_sees_the_packages_types(tmp_path) -> None:
    # py.typed ships with the package, so mypy --strict checks a user's observer against Exchange and
    # the observer protocols, and catches a field that does not exist.
    from importlib.resources import files

    import mypy.api

    assert files("modeltap").joinpath("py.typed").is_file()
    user = tmp_path / "user_observer.py"
    user.write_text(
        "from modeltap import Exchange, ExchangeObserver\n"
        "from modeltap.testing import exchange\n\n"
        "class Counter:\n"
        "    def __init__(self) -> None:\n"
        "        self.seen = 0\n\n"
        "    def on_exchange(self, ex: Exchange) -> None:\n"
        "        self.seen += ex.status or 0\n\n"
        "observer: ExchangeObserver = Counter()\n"
        "observer.on_exchange(exchange())\n"
        "wrong: int = exchange().no_such_field\n"
    )
    out, _, status = mypy.api.run(["--strict", "--no-incremental", "--follow-imports=silent", str(user)])
    assert status == 1 and out.count("error:") == 1 and "no_such_field" in out, out
