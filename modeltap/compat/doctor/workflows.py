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
from dataclasses import dataclass
from importlib.machinery import all_suffixes
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
    if not ctx.workflows and ctx.config.has(ctx.agent) and not ctx.uses_agent_proxy:
        findings.append(_named_elsewhere(ctx))
    return findings


def _named_elsewhere(ctx: Context) -> Finding:
    """The config writes agent-proxy settings but names no workflow: AReaL's own examples pass theirs
    in the training script (examples/math/gsm8k_rl.py gives an RLVRWorkflow, which never starts the
    proxy; examples/tau2/train.py an agent, which does), so the proxy's rules cannot tell."""
    why = (
        f"{ctx.agent} is set, but whether rollouts go through AReaL's agent proxy depends on the workflow, "
        "which this config does not name: a RolloutWorkflow never starts the proxy, an agent does. "
        "The agent-proxy checks (admin-key, engine-max-tokens, micro-batches, decoupled-loss, "
        "template-kwargs) did not run."
    )
    title = "no workflow in the config: the agent-proxy settings went unchecked"
    return Finding(
        "info", "workflow", title, why, "++workflow=PACKAGE.MODULE.AGENT, if the run trains an agent"
    )


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
    where = spec.origin or "a namespace package"
    why = f"{fails} Module {module!r} ({where}) defines no {name!r} at its top level."
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


@dataclass(frozen=True, slots=True)
class Found:
    """A module found on the path: its file (`origin`; None for a namespace package, which has none)
    and, for a package, the folders its submodules are found in."""

    origin: str | None
    locations: tuple[str, ...] | None


def _find_module(name: str) -> Found | None:
    """The module, found without running any package's __init__ (find_spec on a dotted name imports
    its parents, and `areal/__init__.py` pulls in torch and ray). Each step looks in the parent's
    folders as Python's path finder does: a package, then a module, then a namespace package (a folder
    without __init__.py, such as areal/workflow/openai in AReaL 2.0)."""
    top, *rest = name.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = spec.submodule_search_locations
    found: Found | None = Found(spec.origin, None if locations is None else tuple(locations))
    for part in rest:
        if found is None or found.locations is None:
            return None
        found = _child(found.locations, part)
    return found


def _child(folders: tuple[str, ...], part: str) -> Found | None:
    """The submodule `part` of a package whose folders are `folders`."""
    namespace = []
    for folder in folders:
        package = Path(folder, part)
        if (package / "__init__.py").is_file():
            return Found(str(package / "__init__.py"), (str(package),))
        for suffix in all_suffixes():
            if Path(folder, part + suffix).is_file():
                return Found(str(Path(folder, part + suffix)), None)
        if package.is_dir():
            namespace.append(str(package))
    return Found(None, tuple(namespace)) if namespace else None


def _module_names(spec: Found) -> set[str] | None:
    """The names the module's source binds at top level; None when that cannot be told without running
    it (no Python source, a star import, or a module-level __getattr__). A namespace package binds
    nothing but its submodules, which the path finder finds."""
    if spec.origin is None and spec.locations is not None:
        return {Path(f).stem for folder in spec.locations for f in Path(folder).iterdir()}
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
