"""The rule on the workflows (workflow): each `workflow` / `eval_workflow` import path resolves, found
without importing anything, and modeltap's workflow names a bundle and tasks that exist.

Owns: that rule, and finding a module and the names it binds from its source alone. Does not own:
reading a bundle (the caller's `bundle_tasks`, which the adapter provides), the tasks' timeouts
(limits.py's request-timeout).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import shlex
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from modeltap.compat.doctor.context import Context, Finding, Workflow, override


def workflows(ctx: Context) -> list[Finding]:
    """The workflow's import path, bundle and tasks.

    AReaL imports the workflow on every rollout worker (docs/areal.md §3.3), so its path must resolve;
    it is found here without importing anything, and modeltap's workflow must name a bundle and tasks
    that exist."""
    findings = []
    for workflow in ctx.workflows:
        findings.extend(_import_path(workflow))
        if workflow.is_modeltap:
            findings.extend(_bundle(ctx, workflow))
    return findings


def _import_path(workflow: Workflow) -> list[Finding]:
    module, _, name = workflow.import_path.rpartition(".")
    spec = _find_module(module) if module else None
    fails = (
        f'AReaL imports {workflow.import_path!r} on every rollout worker and fails with "Failed to import '
        'workflow from string" (areal/infra/remote_inf_engine.py).'
    )
    if spec is None:
        top = (module or name).split(".")[0]
        if _find_module(top) is None and top != "modeltap":
            why = f"{fails} Package {top!r} is not installed in {sys.executable}, so doctor cannot tell."
            title = f"package {top!r} is not installed here: the workflow path went unchecked"
            fix = "run modeltap doctor in the trainer's Python environment"
            return [Finding("info", workflow.key, title, why, fix)]
        guess = "modeltap.adapter.AgentWorkflow" if top == "modeltap" else "PACKAGE.MODULE.CLASS"
        why = f"{fails} Module {module or name!r} does not exist."
        title = f"workflow module {module!r} not found"
        return [Finding("error", workflow.key, title, why, override(workflow.key, guess))]
    bound = _module_names(spec)
    if bound is None or name in bound:
        return []
    close = difflib.get_close_matches(name, sorted(bound), n=1)
    fix = override(workflow.key, f"{module}.{close[0] if close else 'CLASS'}")
    why = f"{fails} Module {module!r} ({spec.origin}) defines no {name!r} at its top level."
    return [Finding("error", workflow.key, f"{workflow.import_path!r} does not exist", why, fix)]


def _bundle(ctx: Context, workflow: Workflow) -> list[Finding]:
    path = f"{workflow.kwargs_key}.bundle"
    bundle = ctx.config.get(path)
    if not isinstance(bundle, str) or not bundle:
        why = (
            "modeltap's AgentWorkflow plays the tasks of one bundle file and has nothing to play without it."
        )
        return [Finding("error", path, "no bundle given", why, f"++{path}=PATH/TO/bundle.toml")]
    if not Path(bundle).is_file():
        why = f"{bundle} is not a file (relative paths are read from the directory AReaL starts in)."
        return [Finding("error", path, f"bundle {bundle} not found", why, f"++{path}=PATH/TO/bundle.toml")]
    if ctx.bundle_tasks is None:
        return []
    tasks = ctx.tasks(bundle)
    if isinstance(tasks, str):
        fix = "fix the bundle as the message says"
        return [Finding("error", path, f"bundle {bundle} is not valid", tasks, fix)]
    return _tasks(ctx, workflow, bundle, tasks)


def _tasks(ctx: Context, workflow: Workflow, bundle: str, tasks: dict[str, float]) -> list[Finding]:
    """The workflow's `tasks` against the bundle's."""
    tasks_path = f"{workflow.kwargs_key}.tasks"
    chosen = ctx.config.get(tasks_path)
    if chosen is None:
        return []
    if not isinstance(chosen, list) or not all(isinstance(t, str) for t in chosen) or not chosen:
        why = "tasks selects task ids of the bundle: a non-empty list of strings, or leave it out for all."
        fix = shlex.quote(f"~{tasks_path}")
        return [Finding("error", tasks_path, "tasks is not a list of task ids", why, fix)]
    missing = [t for t in chosen if t not in tasks]
    if not missing:
        return []
    kept = [t for t in chosen if t in tasks] or sorted(tasks)
    why = f"{bundle} has the tasks {', '.join(sorted(tasks))}; every row naming another is refused."
    title = f"tasks not in the bundle: {', '.join(missing)}"
    return [Finding("error", tasks_path, title, why, override(tasks_path, kept))]


def _find_module(name: str) -> ModuleSpec | None:
    """The module's spec, found without running any package's __init__ (find_spec on a dotted name
    imports its parents, and `areal/__init__.py` pulls in torch and ray)."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    for depth in range(len(rest)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        full = ".".join([top, *rest[: depth + 1]])
        spec = PathFinder.find_spec(full, list(spec.submodule_search_locations))
    return spec


def _module_names(spec: ModuleSpec) -> set[str] | None:
    """The names the module's source binds at top level; None when that cannot be told without running
    it (no Python source, a star import, or a module-level __getattr__)."""
    if not spec.origin or not spec.origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    bound = _top_level_names(tree.body)
    return None if bound is None or "__getattr__" in bound else bound


def _top_level_names(body: list[ast.stmt]) -> set[str] | None:
    """The names a module body binds, looking inside if/try/with/for blocks but not into functions or
    classes; None after a star import."""
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Import | ast.ImportFrom):
            if any(alias.name == "*" for alias in stmt.names):
                return None
            names.update((alias.asname or alias.name).split(".")[0] for alias in stmt.names)
        elif isinstance(stmt, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        else:
            blocks = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [handler.body for handler in getattr(stmt, "handlers", [])]
            for block in blocks:
                inner = _top_level_names(block)
                if inner is None:
                    return None
                names |= inner
    return names
