"""The rule on misspelt keys (unknown-key): a key that is not one doctor knows, next to one it knows and
looks like (`rollout.agent.engine_max_token` beside `engine_max_tokens`), gets "did you mean …" and a
fix that renames it.

Owns: that rule, and the keys it knows: every path the other rules read while checking this config
(`Context.config.read`), the AReaL keys they use (known even when the rule that reads one could not
run), and the documented fields of the sections they read, so that a real field is never taken for a
misspelling of its neighbour (`DOCUMENTED`). Does not own: the other rules' checks of the values.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from modeltap.compat.doctor.config import Unresolved
from modeltap.compat.doctor.context import Context, Finding, as_int, close_match, override

# AgentConfig's fields (docs/areal.md §5.1), under `{agent}`: rollout.agent, or rollout.openai.
AGENT_CONFIG_FIELDS = (
    "agent_cls_path", "admin_api_key", "mode", "tool_call_parser", "reasoning_parser", "chat_template_type",
    "engine_max_tokens", "turn_discount", "export_style", "subproc_max_workers", "session_timeout_seconds",
    "set_reward_finish_timeout", "message_preprocessors", "prefix_matcher", "drop_retry_orphans",
)  # fmt: skip
# InferenceEngineConfig's fields the proxy path depends on (docs/areal.md §5.1), and the rollout keys
# the rules read.
ROLLOUT_FIELDS = (
    "request_timeout", "request_retries", "deterministic_sampling", "backend", "tokenizer_path",
    "admin_api_key", "_version", "agent", "openai",
)  # fmt: skip
# modeltap's AgentWorkflow arguments, under each workflow's kwargs.
AGENT_WORKFLOW_ARGUMENTS = ("bundle", "tasks", "agent", "runner", "proxy", "timeout_s", "on_failure")
# The other keys of AReaL's the rules use (the package docstring says where AReaL defines them): known
# even when the rule that reads one could not run.
RULE_KEYS = (
    "workflow", "workflow_kwargs", "eval_workflow", "eval_workflow_kwargs", "tokenizer_path",
    "allocation_mode", "sglang.context_length", "vllm.max_model_len", "actor.path", "actor.backend",
    "actor.optimizer_dtype", "actor.optimizer.type", "actor.fsdp.memory_efficient_load",
    "actor.init_from_scratch", "actor.use_decoupled_loss", "actor.recompute_logprob",
    "actor.rejection_sampling", "actor.scheduling_spec", "actor.mb_spec.max_tokens_per_mb",
    "ref.mb_spec.max_tokens_per_mb", "critic.mb_spec.max_tokens_per_mb",
)  # fmt: skip
DOCUMENTED = (
    *RULE_KEYS,
    *(f"{{agent}}.{name}" for name in AGENT_CONFIG_FIELDS),
    *(f"rollout.{name}" for name in ROLLOUT_FIELDS),
)


def unknown_keys(ctx: Context) -> list[Finding]:
    """Keys that look like misspellings of the keys doctor reads.

    It compares each key with the known keys under the same parent, so it runs after every rule that
    reads the config (the registry's last entry)."""
    known = _known_children(_known_paths(ctx))
    findings = []
    for parent in sorted(known):
        present = _raw_mapping(ctx.raw, parent)
        for key in present:
            if key in known[parent]:
                continue
            close = close_match(key, known[parent])
            if close is not None:
                findings.append(_misspelt(ctx, parent, key, close, present[key]))
    return findings


def _known_paths(ctx: Context) -> set[str]:
    """The paths the rules read, with the documented ones."""
    documented = {path.format(agent=ctx.agent) for path in DOCUMENTED}
    for workflow in (w for w in ctx.workflows if w.is_modeltap):
        documented.update(f"{workflow.kwargs_key}.{name}" for name in AGENT_WORKFLOW_ARGUMENTS)
    return documented | ctx.config.read


def _known_children(paths: Iterable[str]) -> dict[str, set[str]]:
    """{parent path ("" for the top): its known keys}, down to the first list index of each path."""
    children: dict[str, set[str]] = {}
    for path in paths:
        parts = path.split(".")
        for depth, part in enumerate(parts):
            if part.isdigit():
                break
            children.setdefault(".".join(parts[:depth]), set()).add(part)
    return children


def _raw_mapping(raw: Mapping[str, Any], parent: str) -> Mapping[str, Any]:
    """The mapping at `parent` as written ({} when it is absent or not a mapping)."""
    node: Any = raw
    for part in parent.split(".") if parent else ():
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def _misspelt(ctx: Context, parent: str, key: str, known: str, value: object) -> Finding:
    prefix = f"{parent}." if parent else ""
    proposed = _proposed(ctx, f"{prefix}{known}", value)
    kept = "keeping its value" if proposed == value else f"with {proposed}, the cap engine-max-tokens asks"
    where = parent or "the top level"
    title = f"unknown key {key!r} in {where}: did you mean {known!r}?"
    why = (
        f"{prefix}{known} is a key doctor reads and {key!r} is none it knows, so the setting written here "
        "is not the one checked. Where AReaL's config classes define the section, AReaL refuses the "
        f"unknown key when the run starts; elsewhere the run ignores it or fails on it. The fix renames it, "
        f"{kept}."
    )
    fix = " ".join([shlex.quote(f"~{prefix}{key}"), override(f"{prefix}{known}", proposed)])
    return Finding("warning", f"{prefix}{key}", title, why, fix)


def _proposed(ctx: Context, path: str, value: object) -> object:
    """The value the rename gives `path`: the one written, except for AReaL's cap, which gets what the
    engine-max-tokens rule would make of it (the number every fix that touches the cap proposes)."""
    if path != f"{ctx.agent}.engine_max_tokens":
        return value
    try:
        return replace(ctx.engine, configured=as_int(value, path)).target
    except Unresolved:  # the value, or the window it is held to, cannot be read: keep it as written
        return value
