"""What every rule of the doctor works from: the `Finding` it returns, the `Context` it reads (the config,
the environment, the bundle's tasks, the GPU) with the views several rules share
(where the agent settings live, the workflows, AReaL's cap against the backend's window), and the
helpers that read numbers and mappings from the config and write fixes as Hydra overrides.

Owns: those shared types and helpers, and the record of which config paths the rules read (the
unknown-key rule compares the keys it finds with them). Does not own: any rule (one module per group
beside this one), running them or rendering what they find (`__init__.py`), loading the YAML
(compat/hydra.py).
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from modeltap.compat.doctor.config import Config, Unresolved
from modeltap.compat.hydra import primitive

Severity = Literal["error", "warning", "info"]
BundleTasks = Callable[[str], dict[str, float]]

# With engine_max_tokens unset, AReaL 2.0+ caps prompt + completion here (docs/areal.md §4.1, gate 2).
AREAL_HIDDEN_TOTAL_CAP = 32768
# sglang.context_length and vllm.max_model_len when the YAML leaves them out (docs/areal.md §4.1 gate 3,
# §5.2).
DEFAULT_CONTEXT_LENGTH = 32768
# How far below the window engine_max_tokens must stay. AReaL passes prompts of up to E - 1 tokens (it
# refuses `E - P <= 0`, docs/areal.md §4.1). SGLang's scheduler refuses P >= C - 6 (max_req_input_len =
# C - 1 - 5, docs/token-budgets.md §1.1, item 4), so E = C - 6 lets through only prompts SGLang takes,
# and keeps P + M <= C - 1, safe even for SGLang before PR #22546 (docs/token-budgets.md §1.2, §7).
# vLLM refuses only P >= C (docs/token-budgets.md §2.1).
SGLANG_WINDOW_MARGIN = 6
VLLM_WINDOW_MARGIN = 1
# How alike two keys must be (difflib's ratio) for one to pass as the other misspelt: one letter off in
# a key of ten letters is 0.9; AReaL's real neighbours, such as scheduling_spec and scheduling_strategy
# (0.77), and workflow and eval_workflow (0.76), stay below it.
SIMILARITY_CUTOFF = 0.8
MODELTAP_WORKFLOWS = frozenset(
    {"modeltap.AgentWorkflow", "modeltap.adapter.AgentWorkflow", "modeltap.adapter.workflow.AgentWorkflow"}
)


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem in a config: how bad (`error` fails the run or wastes it, `warning` risks it, `info`
    says what could not be checked), where (`path`, a config path), what, why, and the exact fix (an
    override such as `++rollout.agent.engine_max_tokens=32762`, or a command; quoted for a POSIX shell).
    `rule` names the rule that found it."""

    severity: Severity
    path: str
    title: str
    why: str
    fix: str
    rule: str = ""


@dataclass(frozen=True, slots=True)
class Workflow:
    """A workflow named in the config: `key` is `workflow` or `eval_workflow` (also when the config
    misspells it: the rules check the workflow as meant, and the unknown-key rule reports the spelling)."""

    key: str
    import_path: str

    @property
    def kwargs_key(self) -> str:
        return f"{self.key}_kwargs"

    @property
    def is_modeltap(self) -> bool:
        return self.import_path in MODELTAP_WORKFLOWS


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """AReaL's total cap (`configured` at `path`, else the hidden cap) against the backend's window
    (`window` at `window_path`, None when the backend reads it from the model), and what the cap
    should be: `target`, the number every fix that touches it proposes, so that fixes agree."""

    path: str
    configured: int | None
    window_path: str
    window: int | None
    margin: int

    @property
    def effective(self) -> int:
        return AREAL_HIDDEN_TOTAL_CAP if self.configured is None else self.configured

    @property
    def safe(self) -> int | None:
        return None if self.window is None else self.window - self.margin

    @property
    def target(self) -> int:
        if self.safe is None or (self.configured is not None and self.configured <= self.safe):
            return self.effective
        return self.safe

    @property
    def longest(self) -> int:
        """The longest trajectory there can be: the cap, or the window if that is smaller."""
        return self.effective if self.window is None else min(self.effective, self.window)


class ReadLog(Config):
    """A `Config` that remembers every path asked of it (`read`), whether it was there or not."""

    def __init__(self, raw: Mapping[str, Any], env: Mapping[str, str]) -> None:
        super().__init__(raw, env)
        self.read: set[str] = set()

    def has(self, path: str) -> bool:
        self.read.add(path)
        return super().has(path)

    def get(self, path: str, default: Any = None) -> Any:
        self.read.add(path)
        return super().get(path, default)

    def size(self, path: str) -> int:
        self.read.add(path)
        return super().size(path)


@dataclass
class Context:
    """What the rules read: the loaded config as written (`raw`) and with its interpolations resolved
    against `env` (`config`), and what the command line says about the run."""

    raw: Mapping[str, Any]
    config: ReadLog
    env: Mapping[str, str]
    bundle_tasks: BundleTasks | None
    gpu_memory_gb: float | None
    token_counter_kwargs: Mapping[str, Any] | None
    _bundles: dict[str, dict[str, float] | str] = field(default_factory=dict)

    @cached_property
    def agent(self) -> str:
        """Where the agent-proxy settings live: `rollout.agent`, or `rollout.openai` in older configs."""
        legacy = "rollout.openai"
        return legacy if self.config.has(legacy) and not self.config.has("rollout.agent") else "rollout.agent"

    @cached_property
    def workflows(self) -> list[Workflow]:
        """The training workflow and the evaluation one, unless the latter repeats the former
        (`eval_workflow: ${workflow}` without kwargs of its own)."""
        found: list[Workflow] = []
        for key in ("workflow", "eval_workflow"):
            path = self.config.get(key)
            misspelt = None if path is not None else self._misspelling_of(key)
            if misspelt is not None:  # read past the log: the unknown-key rule must still see it unknown
                path = Config.get(self.config, misspelt)
            repeat = bool(found) and path == found[0].import_path and not self.config.has(f"{key}_kwargs")
            if isinstance(path, str) and not repeat:
                found.append(Workflow(key, path))
        return found

    def _misspelling_of(self, key: str) -> str | None:
        """A top-level key of the config that is `key` misspelt, as the unknown-key rule sees it."""
        others = [k for k in self.raw if isinstance(k, str) and k not in ("workflow", "eval_workflow")]
        return next((k for k in others if close_match(k, {key}) == key), None)

    @cached_property
    def uses_agent_proxy(self) -> bool:
        """Whether rollouts go through AReaL's agent proxy: the config names a workflow (a modeltap one,
        or an agent of its own), or its agents are online. A config that names none leaves it to the
        training script: AReaL's math examples write an agent section and train an RLVRWorkflow,
        which never starts the proxy."""
        return bool(self.workflows) or self.config.get(f"{self.agent}.mode") == "online"

    @cached_property
    def engine(self) -> EngineLimits:
        path = f"{self.agent}.engine_max_tokens"
        backend = str(self.config.get("rollout.backend") or self.config.get("allocation_mode") or "")
        window_path, margin = (
            ("vllm.max_model_len", VLLM_WINDOW_MARGIN)
            if backend.startswith("vllm")
            else ("sglang.context_length", SGLANG_WINDOW_MARGIN)
        )
        window = as_int(self.config.get(window_path, DEFAULT_CONTEXT_LENGTH), window_path)
        return EngineLimits(path, as_int(self.config.get(path), path), window_path, window, margin)

    def tasks(self, bundle: str) -> dict[str, float] | str:
        """The bundle's {task_id: timeout_s}, or the message of the error reading it. Callers check
        that `bundle_tasks` was given."""
        assert self.bundle_tasks is not None
        if bundle not in self._bundles:
            try:
                self._bundles[bundle] = self.bundle_tasks(bundle)
            except ValueError as exc:
                self._bundles[bundle] = str(exc)
        return self._bundles[bundle]


def close_match(key: str, known: set[str]) -> str | None:
    """The known key `key` looks like: the same in lower case with `_` for `-`, else the closest one."""
    normal = {name.lower().replace("-", "_"): name for name in known}
    exact = normal.get(str(key).lower().replace("-", "_"))
    if exact is not None:
        return exact
    close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=SIMILARITY_CUTOFF)
    return close[0] if close else None


def mapping(ctx: Context, path: str) -> dict[str, Any]:
    """A mapping from the config ({} when absent or null)."""
    value = ctx.config.get(path) or {}
    if not isinstance(value, dict):
        raise Unresolved(path, f"{value!r} is not a mapping")
    return value


def as_int(value: object, path: str) -> int | None:
    number = as_float(value, path)
    return None if number is None else int(number)


def as_float(value: object, path: str) -> float | None:
    """A number from the config; strings count (`${oc.env:...}` gives strings), None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Unresolved(path, f"{value!r} is not a number")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Unresolved(path, f"{value!r} is not a number") from None


def override(path: str, value: object) -> str:
    """`++path=value`, quoted for a POSIX shell where it needs to be."""
    return shlex.quote(f"++{path}={_hydra_value(value)}")


def _hydra_value(value: object) -> str:
    """`value` as a Hydra override value, for the fixes."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_hydra_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = str(value)
    return text if re.fullmatch(r"[\w./-]+", text) and primitive(text) == value else json.dumps(text)
