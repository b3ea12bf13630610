"""The package's folders and the arrows between them (docs/architecture.md §2): every import of every
module of modeltap, at any depth (function-level and TYPE_CHECKING imports included), goes along an
allowed arrow, and the heavy or optional libraries are imported only inside the folder that owns them."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import modeltap

PACKAGE = Path(modeltap.__file__).parent

# What each folder (or top-level module) may import of modeltap, besides itself and the package root
# (`from modeltap import __version__`). Stated here, not derived from the code, so that an import a
# change adds along an arrow docs/architecture.md does not draw fails this test.
ALLOWED: dict[str, set[str]] = {
    "compat": set(),
    "dialects": {"compat"},
    "counting": {"dialects", "compat"},
    "records": {"dialects", "compat"},
    "proxy": {"counting", "records", "dialects", "compat", "exporters.otlp", "exporters.genai"},
    "exporters": {"records", "dialects", "compat"},
    "readers": {"records", "dialects", "compat"},
    "readers.ui": {"readers", "records", "dialects", "compat", "exporters"},
    "replay": {"records", "dialects", "compat"},
    "adapter": {"proxy", "records.exchange", "dialects", "compat"},
    "demo": {"proxy", "records", "readers", "dialects", "compat"},
    "testing": {"records", "dialects"},
    "cli": {"*"},
    "__main__": {"cli"},
}
# Third-party libraries kept inside one folder, each the boundary of an extra or of a concern.
CONFINED = {
    "jinja2": "counting",
    "tiktoken": "counting",
    "tokenizers": "counting",
    "sqlite3": "records",
    "docker": "adapter",
    "opentelemetry": "exporters",
}
# No aiohttp where the code is I/O-free by design (STYLE.md §3).
NO_AIOHTTP = ("counting", "dialects", "records", "compat")


def modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        yield ".".join(p for p in parts if p != "__init__"), path


def imports(path: Path, module: str) -> Iterator[str]:
    """Every module `path` imports, absolute, at any depth in the file."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(["modeltap", *base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            if name == "modeltap":
                # `from modeltap import dialects` names a folder; `__version__` the root itself.
                yield from (
                    f"modeltap.{alias.name}" for alias in node.names if not alias.name.startswith("_")
                )
            else:
                yield name


def folder(module: str) -> str:
    """The folder whose rules apply to `module` (a dotted name below modeltap)."""
    if module.startswith("readers.ui"):
        return "readers.ui"
    return module.split(".")[0]


def allowed(source: str, target: str) -> bool:
    rules = ALLOWED[folder(source)]
    return (
        "*" in rules
        or target.split(".")[0] == folder(source).split(".")[0]
        or any(target == rule or target.startswith(rule + ".") for rule in rules)
    )


def test_every_folder_has_its_rules() -> None:
    assert {folder(name) for name, _ in modules() if name} <= set(ALLOWED)


@pytest.mark.parametrize(("module", "path"), [m for m in modules() if m[0]], ids=lambda v: str(v))
def test_imports_follow_the_arrows(module: str, path: Path) -> None:
    wrong = []
    for imported in imports(path, module):
        top = imported.split(".")[0]
        if top == "modeltap" and imported != "modeltap":
            target = imported.removeprefix("modeltap.")
            if not allowed(module, target):
                wrong.append(f"{module} -> {target}")
        elif top in CONFINED and folder(module).split(".")[0] != CONFINED[top]:
            wrong.append(f"{module} imports {top}, which only modeltap.{CONFINED[top]} may")
        elif top == "aiohttp" and folder(module) in NO_AIOHTTP:
            wrong.append(f"{module} imports aiohttp, which {folder(module)}/ never does")
    assert wrong == []


def test_nothing_imports_the_command_line_and_the_relay_no_reader() -> None:
    for module, path in modules():
        if folder(module) not in ("cli", "__main__"):
            assert not [m for m in imports(path, module) if m.startswith("modeltap.cli")], module
        if folder(module) == "proxy":
            reached = [
                m for m in imports(path, module) if m.startswith(("modeltap.adapter", "modeltap.readers"))
            ]
            assert reached == [], module


def test_a_wrong_arrow_is_caught() -> None:
    # The rules above reject what they should: the test cannot pass whatever the code does.
    assert not allowed("counting.counter", "proxy.budget")
    assert not allowed("records.store", "readers.show")
    assert not allowed("adapter.workflow", "records.store")
    assert allowed("adapter.workflow", "records.exchange")
    assert not allowed("readers.show", "exporters.har")
    assert allowed("readers.ui.app", "exporters.export")
    assert allowed("proxy.server", "exporters.otlp") and not allowed("proxy.server", "exporters.har")
