"""`modeltap doctor CONFIG.yaml [overrides...] [--json]`: the AReaL settings that have cost whole GPU
runs, each reported with why it matters and the exact fix.

Owns: the registry of rules (`_RULES`: rule id and function, run in that order), running them over a
config (`check`), and rendering what they find. Each rule lives in the module of its group: limits.py
(engine-max-tokens, micro-batches, request-timeout), proxy.py (admin-key, v1-paths, template-kwargs,
proxy-budget), gpu.py (small-gpu), training.py (decoupled-loss), workflows.py (workflow), keys.py
(unknown-key). context.py holds what they share; config.py reads the config's values. A rule is a
function from the `Context` to a list of `Finding`s, whose docstring opens with one line saying what
it checks (doctor quotes that line when the rule could not run). Adding one: write it in its group's
module, add its line to `_RULES`.

Does not own: reading the YAML the way AReaL's Hydra does (compat/hydra.py; its `load_config` is
re-exported here), the command line (cli.py parses it, then calls `load_config`, `check`, `render` and
`exit_code`), reading a bundle (the adapter's: cli.py passes `bundle_tasks`), or finding out the GPU's
memory (cli.py passes `gpu_memory_gb`).

Where AReaL keeps the keys (areal/api/cli_args.py at areal-project/AReaL@001d59eb, and its examples):
    rollout.agent.*              AgentConfig: admin_api_key, engine_max_tokens, mode (legacy configs:
                                 rollout.openai.*, e.g. inclusionAI/AReaL examples/agent_workflow/config.yaml)
    rollout.request_timeout      InferenceEngineConfig (default 3600 s)
    rollout._version, rollout.admin_api_key, rollout.backend
    sglang.context_length        SGLangConfig (default 32768); vllm.max_model_len (default 32768)
    actor.mb_spec.max_tokens_per_mb, actor.optimizer_dtype, actor.fsdp.memory_efficient_load,
    actor.use_decoupled_loss, actor.scheduling_spec[i].env_vars     TrainEngineConfig, PPOActorConfig
    workflow, workflow_kwargs    top-level keys of the agent experiments (examples/experimental/proxy/
                                 configs.py; examples/swe/qwen3_30b_a3b_grpo.yaml for a full one)
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from typing import Any

from modeltap.compat.doctor import gpu, keys, limits, proxy, training, workflows
from modeltap.compat.doctor.config import Unresolved
from modeltap.compat.doctor.context import BundleTasks, Context, Finding, ReadLog
from modeltap.compat.hydra import load_config as load_config  # doctor's API: load, check, render

__all__ = ["EXIT_ERRORS", "RULES", "Finding", "check", "exit_code", "load_config", "render"]

# Exit status when any finding is an error. (A config that cannot be read is cli.py's business: it
# gets load_config's ValueError.)
EXIT_ERRORS = 1
# Terminal width for `why`; fixes stay on one line so that they can be pasted.
RENDER_WIDTH = 100

Rule = Callable[[Context], list[Finding]]
_RULES: tuple[tuple[str, Rule], ...] = (
    ("engine-max-tokens", limits.engine_max_tokens),
    ("admin-key", proxy.admin_key),
    ("v1-paths", proxy.v1_paths),
    ("micro-batches", limits.micro_batches),
    ("small-gpu", gpu.small_gpu),
    ("decoupled-loss", training.decoupled_loss),
    ("template-kwargs", proxy.template_kwargs),
    ("proxy-budget", proxy.proxy_budget),
    ("request-timeout", limits.request_timeout),
    ("workflow", workflows.workflows),
    ("unknown-key", keys.unknown_keys),  # last: it compares the config's keys with what the others read
)
RULES: tuple[str, ...] = tuple(rule_id for rule_id, _ in _RULES)


def check(
    config: Mapping[str, Any],
    *,
    env: Mapping[str, str],
    bundle_tasks: BundleTasks | None = None,
    gpu_memory_gb: float | None = None,
    token_counter_kwargs: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Run every rule over a config from `load_config`; errors first, then warnings, then info.

    `env` resolves `${oc.env:...}` and stands for the trainer's environment. `bundle_tasks(path)`
    returns a bundle's {task_id: timeout_s} or raises ValueError (None: bundle contents unchecked).
    `gpu_memory_gb` is one GPU's memory (None: the small-GPU rules are skipped). `token_counter_kwargs`
    are the chat_template_kwargs modeltap's counter is given outside the config. A value a rule needs
    but cannot read (an unset environment variable, say) stops that rule: the finding about that value,
    or else an `info` finding, names the rules it stopped.

        findings = check(load_config("grpo.yaml", []), env=os.environ, gpu_memory_gb=24)
    """
    ctx = Context(
        raw=config,
        config=ReadLog(config, env),
        env=env,
        bundle_tasks=bundle_tasks,
        gpu_memory_gb=gpu_memory_gb,
        token_counter_kwargs=token_counter_kwargs,
    )
    findings: list[Finding] = []
    stopped: dict[str, tuple[Unresolved, list[str]]] = {}
    for rule_id, rule in _RULES:
        try:
            findings.extend(replace(f, rule=rule_id) for f in rule(ctx))
        except Unresolved as exc:
            stopped.setdefault(exc.path, (exc, []))[1].append(rule_id)
        except Exception as exc:  # a rule's bug must cost its own check only, never a traceback
            findings.append(_failed(rule_id, rule, exc))
    for unresolved, rule_ids in stopped.values():
        findings = _report_stopped(findings, unresolved, rule_ids)
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


def _report_stopped(findings: list[Finding], unresolved: Unresolved, rule_ids: list[str]) -> list[Finding]:
    """`findings` saying which rules `unresolved` stopped: in the why of a finding about the same path
    (a bundle that is not there), else in an `info` finding of its own."""
    path = unresolved.path
    blocker = next((f for f in findings if f.path == path), None)
    if blocker is not None:
        why = f"{blocker.why} Until this is fixed, doctor cannot check {_described(rule_ids)}."
        return [replace(f, why=why) if f is blocker else f for f in findings]
    title = f"{path} could not be read, so {_names(rule_ids)} did not run"
    fix = f"++{path}=VALUE"
    if unresolved.needs:
        fix = f"export {unresolved.needs}=... as the trainer will have it, or {fix}"
    why = f"{unresolved.reason}. Not checked: {_described(rule_ids)}."
    return [*findings, Finding("info", path, title, why, fix, rule_ids[0])]


def _failed(rule_id: str, rule: Rule, exc: Exception) -> Finding:
    """The `info` finding of a rule that raised on this config."""
    title = f"the {rule_id} check failed on this config: {type(exc).__name__}: {exc}"
    why = f"Not checked: {_summary(rule)} ({rule_id}). The other checks ran."
    return Finding("info", rule_id, title, why, "report it to modeltap with the config", rule_id)


def _names(rule_ids: Sequence[str]) -> str:
    """ "the admin-key check", "the micro-batches and proxy-budget checks"."""
    if len(rule_ids) == 1:
        return f"the {rule_ids[0]} check"
    return f"the {', '.join(rule_ids[:-1])} and {rule_ids[-1]} checks"


def _described(rule_ids: Sequence[str]) -> str:
    """What each rule checks, from the first line of its docstring: "the admin key AReaL's proxy starts
    with (admin-key)"."""
    rules = dict(_RULES)
    return "; ".join(f"{_summary(rules[rule_id])} ({rule_id})" for rule_id in rule_ids)


def _summary(rule: Rule) -> str:
    """A rule's docstring's first line, as a phrase: without its full stop, and in lower case unless
    its first word is a name (AReaL, modeltap, rollout.request_timeout)."""
    line = (rule.__doc__ or "").strip().splitlines()[0].rstrip(".")
    return line[:1].lower() + line[1:] if line[1:2].islower() else line


def exit_code(findings: Sequence[Finding]) -> int:
    """EXIT_ERRORS when any finding is an error, else 0."""
    return EXIT_ERRORS if any(f.severity == "error" for f in findings) else 0


def render(findings: Sequence[Finding], as_json: bool) -> str:
    """The findings for a terminal, or as JSON for scripts:
    `{"format": 1, "findings": [{severity, path, title, why, fix, rule}], "counts": {...}}`."""
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    if as_json:
        return json.dumps(
            {"format": 1, "findings": [asdict(f) for f in findings], "counts": counts}, indent=2
        )
    lines = []
    for f in findings:
        why = textwrap.fill(
            f.why, RENDER_WIDTH, initial_indent="  why: ", subsequent_indent="       ", break_on_hyphens=False
        )
        lines += [f"{f.severity:<8}{f.path}", f"  {f.title}", why, f"  fix: {f.fix}", ""]
    lines.append(", ".join(f"{n} {s}{'' if n == 1 or s == 'info' else 's'}" for s, n in counts.items()))
    return "\n".join(lines)
