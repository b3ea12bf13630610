"""`modeltap doctor CONFIG.yaml [overrides...] [--json]`: the AReaL settings that have cost whole GPU
runs, each reported with why it matters and the exact fix.

Owns: the rules, and rendering what they find. Does not own: reading the YAML the way AReaL's Hydra
does (hydra.py; its `load_config` is re-exported here), the command line (cli.py builds it with
`add_arguments`, then calls `load_config`, `check`, `render` and `exit_code`), reading a bundle
(the adapter's: cli.py passes `bundle_tasks`), or finding out the GPU's memory (cli.py passes
`gpu_memory_gb`).

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

Each rule's docstring says where its rule comes from; `Finding.rule` names it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib.util
import json
import math
import re
import secrets
import shlex
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from typing import Any, Literal

from modeltap.compat.areal import ArealCapabilities, capabilities, installed_version
from modeltap.compat.hydra import Config, Unresolved, primitive
from modeltap.compat.hydra import load_config as load_config  # doctor's API: load, check, render

Severity = Literal["error", "warning", "info"]
BundleTasks = Callable[[str], dict[str, float]]

# Exit status when any finding is an error. (A config that cannot be read is cli.py's business: it
# gets load_config's ValueError.)
EXIT_ERRORS = 1
# AReaL's well-known default admin key (areal-proxy-protocol.md §5.3: SRV:211, HTTPU:23).
DEFAULT_ADMIN_API_KEY = "areal-admin-key"
# With engine_max_tokens unset, AReaL 2.0+ caps prompt + completion here (areal-proxy-protocol.md
# §4.1, gate 2: CL:170).
AREAL_HIDDEN_TOTAL_CAP = 32768
# sglang.context_length and vllm.max_model_len when the YAML leaves them out (areal-proxy-protocol.md
# §4.1 gate 3, §5.2: CLI:2188, CLI:2043).
DEFAULT_CONTEXT_LENGTH = 32768
# How far below the window engine_max_tokens must stay. AReaL passes prompts of up to E - 1 tokens
# (it refuses `E - P <= 0`, areal-proxy-protocol.md §4.1). SGLang's scheduler refuses P >= C - 6
# (max_req_input_len = C - 1 - 5, token-budgets.md §1.1 step 4), so E = C - 6 lets through only
# prompts SGLang takes, and keeps P + M <= C - 1, safe even for SGLang before PR #22546
# (token-budgets.md §1.2, §7). vLLM refuses only P >= C (§2.1).
SGLANG_WINDOW_MARGIN = 6
VLLM_WINDOW_MARGIN = 1
# rollout.request_timeout's default (areal-proxy-protocol.md §5.1: CLI:2561).
DEFAULT_REQUEST_TIMEOUT_S = 3600.0
# What a rollout spends outside the task's own timeout: session start, container start, scoring,
# export. A margin, not a measurement.
REQUEST_TIMEOUT_MARGIN_S = 300.0
# The GPU size at and below which the memory-saving settings decide whether training fits (issue 6).
SMALL_GPU_GB = 24.0
EXPANDABLE_SEGMENTS = "expandable_segments:True"
# Terminal width for `why`; fixes stay on one line so that they can be pasted.
RENDER_WIDTH = 100
MODELTAP_WORKFLOWS = frozenset(
    {"modeltap.AgentWorkflow", "modeltap.adapter.AgentWorkflow", "modeltap.adapter.workflow.AgentWorkflow"}
)
# Template kwargs whose absence means this value: Qwen3's template thinks unless told
# enable_thinking=False (token-budgets.md §5.2).
TEMPLATE_KWARG_DEFAULTS: Mapping[str, object] = {"enable_thinking": True}
# Where AReaL's own tokenizer is named, most specific first (InferenceEngineConfig.tokenizer_path,
# BaseExperimentConfig.tokenizer_path, TrainEngineConfig.path).
TOKENIZER_KEYS = ("rollout.tokenizer_path", "tokenizer_path", "actor.path")


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


# --- The rules ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Workflow:
    """A workflow named in the config: `key` is `workflow` or `eval_workflow`."""

    key: str
    import_path: str

    @property
    def kwargs_key(self) -> str:
        return f"{self.key}_kwargs"

    @property
    def is_modeltap(self) -> bool:
        return self.import_path in MODELTAP_WORKFLOWS


@dataclass(frozen=True, slots=True)
class _EngineLimits:
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


@dataclass
class _Context:
    config: Config
    env: Mapping[str, str]
    bundle_tasks: BundleTasks | None
    gpu_memory_gb: float | None
    token_counter_kwargs: Mapping[str, Any] | None
    areal: ArealCapabilities
    _bundles: dict[str, dict[str, float] | str] = field(default_factory=dict)

    @cached_property
    def agent(self) -> str:
        """Where the agent-proxy settings live: `rollout.agent`, or `rollout.openai` in older configs."""
        legacy = "rollout.openai"
        return legacy if self.config.has(legacy) and not self.config.has("rollout.agent") else "rollout.agent"

    @cached_property
    def workflows(self) -> list[_Workflow]:
        """The training workflow and the evaluation one, unless the latter repeats the former
        (`eval_workflow: ${workflow}` without kwargs of its own)."""
        found: list[_Workflow] = []
        for key in ("workflow", "eval_workflow"):
            path = self.config.get(key)
            repeat = bool(found) and path == found[0].import_path and not self.config.has(f"{key}_kwargs")
            if isinstance(path, str) and not repeat:
                found.append(_Workflow(key, path))
        return found

    @cached_property
    def uses_agent_proxy(self) -> bool:
        """Whether rollouts go through AReaL's agent proxy: a modeltap workflow, or an agent section."""
        return any(w.is_modeltap for w in self.workflows) or self.config.has(self.agent)

    @cached_property
    def engine(self) -> _EngineLimits:
        path = f"{self.agent}.engine_max_tokens"
        backend = str(self.config.get("rollout.backend") or self.config.get("allocation_mode") or "")
        window_path, margin = (
            ("vllm.max_model_len", VLLM_WINDOW_MARGIN)
            if backend.startswith("vllm")
            else ("sglang.context_length", SGLANG_WINDOW_MARGIN)
        )
        window = _as_int(self.config.get(window_path, DEFAULT_CONTEXT_LENGTH), window_path)
        return _EngineLimits(path, _as_int(self.config.get(path), path), window_path, window, margin)

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


def _engine_max_tokens(ctx: _Context) -> list[Finding]:
    """engine_max_tokens must stay below the backend's window (areal-proxy-protocol.md §4.1, §5.1-5.2;
    token-budgets.md §1.1, §7). AReaL never compares the two; unset, a hidden 32768 cap applies."""
    if not ctx.uses_agent_proxy:
        return []
    limits = ctx.engine
    path, limit, window_path, window = limits.path, limits.configured, limits.window_path, limits.window
    refusal = (
        'An over-long prompt then comes back to the agent as HTTP 500 ("max_new_tokens (X) is '
        'non-positive!" from the cap, or "Failed after N retries ... /generate" once the backend has '
        "refused it request_retries times), never as the 400 context_length_exceeded agents compact on."
    )
    unset = f"engine_max_tokens is unset, so AReaL caps every request at a hidden {AREAL_HIDDEN_TOTAL_CAP}"
    if window is None:  # null: the backend takes the window from the model's config.json
        if limit is not None:
            return []
        why = f"{window_path} is null, so the window comes from the model's config.json. {refusal}"
        return [Finding("warning", path, unset, why, f"++{path}=CONTEXT_LENGTH_MINUS_{limits.margin}")]
    if limit is not None and limit == limits.target:
        return []
    fix = _override(path, limits.target)
    if limit is None:
        why = (
            f"AReaL 2.0+ caps prompt + completion at {AREAL_HIDDEN_TOTAL_CAP} when engine_max_tokens is "
            f"unset (earlier versions do not cap at all); {window_path} is {window}. {refusal}"
        )
        return [Finding("error", path, unset, why, fix)]
    if limit >= window:
        title = f"engine_max_tokens ({limit}) is not below {window_path} ({window})"
        why = (
            f"AReaL passes prompts of up to engine_max_tokens - 1 tokens to the backend and never checks "
            f"them against {window_path}. {refusal}"
        )
        return [Finding("error", path, title, why, fix)]
    title = f"engine_max_tokens ({limit}) leaves no room for SGLang's scheduler margin"
    why = (
        f"SGLang's scheduler refuses a prompt of {window_path} - {SGLANG_WINDOW_MARGIN} tokens or more "
        f"(max_req_input_len = C - 1 - 5), yet AReaL passes prompts of up to {limit - 1} tokens."
    )
    return [Finding("warning", path, title, why, fix)]


def _admin_key(ctx: _Context) -> list[Finding]:
    """The default admin key on AReaL's network bind: AReaL 2.0 (and the 1.0.4 wheel) refuse to start
    (areal-proxy-protocol.md §5.3, §7 #3; areal-tier.md §4). The scheduler always starts the proxy with
    --host 0.0.0.0, which AReaL resolves to the host's address, never loopback (§5.3, §6)."""
    if not ctx.uses_agent_proxy:
        return []
    path = (
        "rollout.admin_api_key"
        if ctx.config.get("rollout._version") == "v2"
        else f"{ctx.agent}.admin_api_key"
    )
    if ctx.config.get(path, DEFAULT_ADMIN_API_KEY) != DEFAULT_ADMIN_API_KEY:
        return []
    fix = _override(path, secrets.token_urlsafe(32))
    if ctx.env.get("AREAL_ALLOW_DEFAULT_ADMIN_KEY") == "1":
        why = (
            "AREAL_ALLOW_DEFAULT_ADMIN_KEY=1 lets AReaL start with the published key on a network address: "
            "anyone who can reach the proxy can start sessions and set rewards (CWE-798, AReaL PR #1323)."
        )
        return [Finding("warning", path, "the default admin key is published", why, fix)]
    why = (
        "AReaL binds its proxy to the host's network address (the scheduler passes --host 0.0.0.0, resolved "
        'by gethostip()), and refuses to start there with the default key: RuntimeError "Refusing to start '
        'server on non-loopback host ... with the default admin API key" at /call initialize.'
    )
    return [Finding("error", path, "AReaL will refuse to start with the default admin key", why, fix)]


def _v1_paths(ctx: _Context) -> list[Finding]:
    """AReaL 2.1.0 and earlier serve chat only at the bare path; an agent whose base URL ends in /v1 gets
    404 {"detail":"Not Found"} (areal-proxy-protocol.md §1.1, §2). modeltap's workflow is immune (its
    proxy accepts every /v1 habit); agents that reach AReaL themselves, in online mode, are not."""
    path = f"{ctx.agent}.mode"
    if ctx.config.get(path, "inline") != "online" or ctx.areal.serves_v1_chat:
        return []
    if ctx.areal.version is None:
        title = "AReaL version unknown: whether online agents may use /v1 was not checked"
        why = "AReaL is not installed here; 2.1.0 and earlier answer /v1/chat/completions with 404."
        return [Finding("info", path, title, why, "modeltap doctor --areal-version VERSION ...")]
    why = (
        "In online mode the agents reach AReaL's gateway with their own base URLs. AReaL "
        f"{ctx.areal.version} serves chat only at /chat/completions, so an agent configured the usual "
        'way for opencode or the openai SDK (a base URL ending in /v1) gets 404 {"detail":"Not Found"} '
        "on every request. The fix puts modeltap, which serves every endpoint with and without /v1, "
        "between them: give the agents the URLs it prints. Or upgrade AReaL past 2.1.0."
    )
    fix = "modeltap serve --upstream http://GATEWAY_HOST:PORT --layout areal --host 0.0.0.0"
    return [Finding("warning", path, "online agents that append /v1 will get 404 from AReaL", why, fix)]


def _micro_batches(ctx: _Context) -> list[Finding]:
    """max_tokens_per_mb below the longest trajectory: a sequence of up to engine_max_tokens tokens has
    to fit one micro-batch (MicroBatchSpec, cli_args.py; issue 6)."""
    if not ctx.uses_agent_proxy:
        return []
    longest = ctx.engine.longest
    findings = []
    for role in ("actor", "ref", "critic"):
        path = f"{role}.mb_spec.max_tokens_per_mb"
        per_mb = _as_int(ctx.config.get(path), path)
        if per_mb is None or per_mb >= longest:
            continue
        why = (
            f"One trajectory can hold up to {longest} tokens (engine_max_tokens, prompt plus completion), "
            f"and AReaL packs whole sequences into micro-batches of at most max_tokens_per_mb = {per_mb} "
            "tokens: a longer one fits none, and the train step fails after its rollouts' GPU time is spent."
        )
        title = f"{role}'s micro-batches ({per_mb} tokens) are smaller than one trajectory ({longest})"
        findings.append(Finding("error", path, title, why, _override(path, longest)))
    return findings


def _small_gpu(ctx: _Context) -> list[Finding]:
    """On GPUs of 24 GB or less, training fits only with bf16 optimizer state, CPU-side loading and
    expandable segments (issue 6; the fields' help in cli_args.py TrainEngineConfig, FSDPEngineConfig)."""
    if ctx.gpu_memory_gb is None:
        title = "GPU memory unknown: the small-GPU settings were not checked"
        why = (
            f"GPUs of {SMALL_GPU_GB:g} GB or less need memory-saving settings; the GPU's size was not given."
        )
        return [Finding("info", "actor", title, why, "modeltap doctor --gpu-memory-gb N ...")]
    if ctx.gpu_memory_gb > SMALL_GPU_GB:
        return []
    gpu = f"On a {ctx.gpu_memory_gb:g} GB GPU"
    findings = []
    backend = str(ctx.config.get("actor.backend") or "fsdp")
    if backend.startswith("fsdp"):  # Megatron and Archon ignore both FSDP settings
        dtype = ctx.config.get("actor.optimizer_dtype", "float32")
        if dtype not in ("bfloat16", "bf16"):
            why = (
                f"{gpu}, fp32 master weights and Adam state (optimizer_dtype {dtype}) take 12 bytes a "
                "parameter: 'bfloat16' with optimizer.type 'adam_bf16' halves that (cli_args.py "
                "TrainEngineConfig.optimizer_dtype)."
            )
            fix = " ".join(
                [
                    _override("actor.optimizer_dtype", "bfloat16"),
                    _override("actor.optimizer.type", "adam_bf16"),
                ]
            )
            findings.append(Finding("warning", "actor.optimizer_dtype", "optimizer state in fp32", why, fix))
        load_path = "actor.fsdp.memory_efficient_load"
        if ctx.config.get(load_path) is not True and ctx.config.get("actor.init_from_scratch") is not True:
            why = (
                f"{gpu}, every rank loading the full checkpoint onto the GPU before sharding can run out "
                "of memory at start-up; memory_efficient_load loads on CPU and broadcasts after sharding "
                "(cli_args.py FSDPEngineConfig)."
            )
            title = "weights load onto every GPU at once"
            findings.append(Finding("warning", load_path, title, why, _override(load_path, True)))
    findings.extend(_alloc_conf(ctx, gpu))
    return findings


def _alloc_conf(ctx: _Context, gpu: str) -> list[Finding]:
    """PYTORCH_CUDA_ALLOC_CONF, from the environment or from actor.scheduling_spec[i].env_vars."""
    name = "PYTORCH_CUDA_ALLOC_CONF"
    paths = [
        f"actor.scheduling_spec.{i}.env_vars.{name}" for i in range(ctx.config.size("actor.scheduling_spec"))
    ]
    values = [ctx.env.get(name)] + [ctx.config.get(p) for p in paths]
    if any(EXPANDABLE_SEGMENTS in [o.strip() for o in str(v).split(",")] for v in values if v):
        return []
    current = next((str(v) for v in values if v), "")
    wanted = f"{current},{EXPANDABLE_SEGMENTS}" if current else EXPANDABLE_SEGMENTS
    why = (
        f"{gpu}, rollouts of very different lengths fragment the CUDA caching allocator until an "
        "allocation fails with memory to spare; expandable segments let it grow blocks in place. Set it "
        "in the workers' env_vars (as AReaL's examples/swe/*.yaml do), or export it where the trainer starts."
    )
    if not paths:  # the YAML leaves scheduling_spec to AReaL's default, so there is no list to override
        fix = f"export {name}={shlex.quote(wanted)}"
        return [Finding("warning", f"env:{name}", "CUDA allocator without expandable segments", why, fix)]
    path = f"actor.scheduling_spec.0.env_vars.{name}"
    return [
        Finding("warning", path, "CUDA allocator without expandable segments", why, _override(path, wanted))
    ]


def _decoupled_loss(ctx: _Context) -> list[Finding]:
    """Decoupled PPO weights every token by pi_prox/pi_behave, with pi_behave the log-probs AReaL's
    proxy recorded while the agent ran (areal-proxy-protocol.md §1.1, §4.3; cli_args.py
    PPOActorConfig.use_decoupled_loss, rejection_sampling)."""
    if not ctx.uses_agent_proxy or ctx.config.get("actor.use_decoupled_loss") is not True:
        return []
    unfiltered = ctx.config.get("actor.rejection_sampling") is None
    why = (
        "Through the proxy the behaviour log-probs are whatever the agent's requests produced: the agent "
        "picks its own temperature and top_p (AReaL only fills in 1.0 when they are missing) while the "
        "trainer recomputes at actor.temperature, and a weight update in mid-completion makes one "
        "completion span several policy versions. Both skew the importance weight"
        + (", and with rejection_sampling unset nothing bounds it." if unfiltered else ".")
        + " The fix trains on log-probs the trainer recomputes. To keep the decoupled loss instead, make "
        "every agent send temperature = actor.temperature and set actor.rejection_sampling to "
        "{level: token, action: mask, metric: ratio, upper: 5.0}."
    )
    fix = " ".join([_override("actor.use_decoupled_loss", False), _override("actor.recompute_logprob", True)])
    title = "decoupled loss on behaviour log-probs recorded through the agent proxy"
    return [Finding("warning", "actor.use_decoupled_loss", title, why, fix)]


def _template_kwargs(ctx: _Context) -> list[Finding]:
    """modeltap's token counter must render the chat template as AReaL does. AReaL's proxy strips
    chat_template_kwargs from every request (areal-proxy-protocol.md §1.1, §5.1), so it renders with
    none: Qwen3 keeps thinking on, whatever the agent or the counter is told (token-budgets.md §5.2)."""
    if not ctx.uses_agent_proxy:
        return []
    if ctx.token_counter_kwargs is not None:
        counter_path, counter = "--chat-template-kwargs", dict(ctx.token_counter_kwargs)
    else:
        modeltap = next((w for w in ctx.workflows if w.is_modeltap), None)
        if modeltap is None:
            return []
        counter_path = f"{modeltap.kwargs_key}.proxy.chat_template_kwargs"
        counter = _mapping(ctx, counter_path)
    areal = _mapping(ctx, f"{ctx.agent}.chat_template_kwargs")
    differing = sorted(
        key
        for key in {*counter, *areal}
        if counter.get(key, TEMPLATE_KWARG_DEFAULTS.get(key))
        != areal.get(key, TEMPLATE_KWARG_DEFAULTS.get(key))
    )
    template = _chat_template(ctx)
    if not differing or (template is not None and not any(key in template for key in differing)):
        return []
    thinking = "enable_thinking" in differing
    title = (
        "Qwen3 thinking differs between modeltap's token counter and AReaL"
        if thinking
        else "chat_template_kwargs differ between modeltap's token counter and AReaL"
    )
    why = (
        f"AReaL renders the chat template with {areal or 'no kwargs'} (its proxy drops chat_template_kwargs "
        f"from every request); modeltap's counter renders with {counter}. Every count is off, so the "
        "budget clamps and rejects on wrong numbers"
        + (
            "; and the policy trains with thinking on, whatever this setting says: Qwen3 thinks unless "
            "enable_thinking=False, which adds an empty <think></think> to the prompt. To train without "
            "thinking, serve a chat template that turns it off by default: AReaL cannot be told per request."
            if thinking
            else "."
        )
    )
    if counter_path.startswith("--"):
        fix = f"{counter_path} {shlex.quote(json.dumps(areal))}"
    else:
        fix = _override(counter_path, areal)
    return [Finding("error", counter_path, title, why, fix)]


def _proxy_budget(ctx: _Context) -> list[Finding]:
    """modeltap answers an over-long prompt with the 400 agents compact on only when it counts (a
    tokenizer) and knows AReaL's cap; otherwise the prompt reaches AReaL, which answers 500 (issue 3;
    areal-proxy-protocol.md §4.1; DESIGN §4: no tokenizer, no budget)."""
    areal_cap = ctx.engine.target
    refusal = (
        'AReaL answers it with HTTP 500 ("len of prompt tokens N exceeds max_total_tokens M"), which agents '
        "retry or die on, instead of the 400 context_length_exceeded they compact on and go on."
    )
    findings = []
    for workflow in (w for w in ctx.workflows if w.is_modeltap):
        proxy = f"{workflow.kwargs_key}.proxy"
        if not ctx.config.get(f"{proxy}.tokenizer"):
            why = f"With no tokenizer modeltap counts nothing: an over-long prompt reaches AReaL. {refusal}"
            fix = _override(f"{proxy}.tokenizer", _areal_tokenizer(ctx))
            findings.append(
                Finding("warning", f"{proxy}.tokenizer", "modeltap's token budget is off", why, fix)
            )
        cap = _as_int(ctx.config.get(f"{proxy}.engine_max_tokens"), f"{proxy}.engine_max_tokens")
        if cap is None or cap > areal_cap:
            title = f"modeltap's budget does not hold to AReaL's cap of {areal_cap} tokens"
            why = (
                f"{proxy}.engine_max_tokens is {cap or 'unset'}, so modeltap lets through prompts that AReaL "
                f"(with engine_max_tokens at {areal_cap}, as it should be) refuses. {refusal}"
            )
            fix = _override(f"{proxy}.engine_max_tokens", areal_cap)
            findings.append(Finding("warning", f"{proxy}.engine_max_tokens", title, why, fix))
    return findings


def _areal_tokenizer(ctx: _Context) -> str:
    """The tokenizer AReaL is configured with, for a fix, or a placeholder when it cannot be read."""
    return next(_tokenizers(ctx), "PATH/TO/TOKENIZER")


def _chat_template(ctx: _Context) -> str | None:
    """The served chat template's text when the tokenizer is a local folder, else None (unknown)."""
    for folder in _tokenizers(ctx):
        config_file, jinja = Path(folder, "tokenizer_config.json"), Path(folder, "chat_template.jinja")
        try:
            if jinja.is_file():
                return jinja.read_text(encoding="utf-8")
            if not config_file.is_file():
                continue
            template = json.loads(config_file.read_text(encoding="utf-8")).get("chat_template")
        except (OSError, ValueError, AttributeError):
            return None
        if isinstance(template, list):  # named templates: [{"name", "template"}, ...]
            return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
        return template if isinstance(template, str) else None
    return None


def _tokenizers(ctx: _Context) -> Iterator[str]:
    """AReaL's tokenizer paths as configured, most specific first, skipping what cannot be resolved."""
    for key in TOKENIZER_KEYS:
        try:
            value = ctx.config.get(key)
        except Unresolved:
            continue
        if isinstance(value, str) and value:
            yield value


def _request_timeout(ctx: _Context) -> list[Finding]:
    """rollout.request_timeout must outlast the longest episode: past it AReaL's controller stops waiting
    and counts the sample rejected while the agent keeps running (areal-proxy-protocol.md §4.3)."""
    limits = [limit for w in ctx.workflows if w.is_modeltap for limit in _run_limits(ctx, w)]
    if not limits:
        return []
    longest = max(limits)
    path = "rollout.request_timeout"
    timeout = _as_float(ctx.config.get(path, DEFAULT_REQUEST_TIMEOUT_S), path)
    needed = longest[0] + REQUEST_TIMEOUT_MARGIN_S
    if timeout is None or timeout >= needed:
        return []
    why = (
        f"{longest[1]} may run {longest[0]:g} s, plus about {REQUEST_TIMEOUT_MARGIN_S:g} s of "
        f"session and container start, scoring and export; AReaL waits {timeout:g} s, then counts the "
        "sample rejected while the agent keeps running, so the episode's GPU time is spent for nothing."
    )
    severity: Severity = "error" if timeout < longest[0] else "warning"
    title = f"rollout.request_timeout ({timeout:g} s) is shorter than the longest episode"
    return [Finding(severity, path, title, why, _override(path, math.ceil(needed)))]


def _run_limits(ctx: _Context, workflow: _Workflow) -> list[tuple[float, str]]:
    """How long each run of a modeltap workflow may last, and what it is: `timeout_s` replaces the
    tasks' own limits (AgentWorkflow); else each chosen task's, when the bundle can be read."""
    kwargs = workflow.kwargs_key
    timeout = _as_float(ctx.config.get(f"{kwargs}.timeout_s"), f"{kwargs}.timeout_s")
    if timeout is not None:
        return [(timeout, f"Every run ({kwargs}.timeout_s)")]
    bundle = ctx.config.get(f"{kwargs}.bundle")
    if ctx.bundle_tasks is None or not isinstance(bundle, str):
        return []
    tasks = ctx.tasks(bundle)
    if not isinstance(tasks, dict):
        return []
    chosen = ctx.config.get(f"{kwargs}.tasks") or list(tasks)
    return [(tasks[t], f"Task {t!r}") for t in chosen if t in tasks]


def _workflows(ctx: _Context) -> list[Finding]:
    """The workflow's import path resolves without importing anything (AReaL imports it on every worker,
    areal-proxy-protocol.md §3.3), and modeltap's workflow names a bundle and tasks that exist."""
    findings = []
    for workflow in ctx.workflows:
        findings.extend(_import_path(workflow))
        if workflow.is_modeltap:
            findings.extend(_bundle(ctx, workflow))
    return findings


def _import_path(workflow: _Workflow) -> list[Finding]:
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
        return [
            Finding(
                "error",
                workflow.key,
                f"workflow module {module!r} not found",
                why,
                _override(workflow.key, guess),
            )
        ]
    bound = _module_names(spec)
    if bound is None or name in bound:
        return []
    close = difflib.get_close_matches(name, sorted(bound), n=1)
    fix = _override(workflow.key, f"{module}.{close[0] if close else 'CLASS'}")
    why = f"{fails} Module {module!r} ({spec.origin}) defines no {name!r} at its top level."
    return [Finding("error", workflow.key, f"{workflow.import_path!r} does not exist", why, fix)]


def _bundle(ctx: _Context, workflow: _Workflow) -> list[Finding]:
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
        return [
            Finding(
                "error", path, f"bundle {bundle} is not valid", tasks, "fix the bundle as the message says"
            )
        ]
    tasks_path = f"{workflow.kwargs_key}.tasks"
    chosen = ctx.config.get(tasks_path)
    if chosen is None:
        return []
    if not isinstance(chosen, list) or not all(isinstance(t, str) for t in chosen) or not chosen:
        why = "tasks selects task ids of the bundle: a non-empty list of strings, or leave it out for all."
        return [
            Finding(
                "error", tasks_path, "tasks is not a list of task ids", why, shlex.quote(f"~{tasks_path}")
            )
        ]
    missing = [t for t in chosen if t not in tasks]
    if not missing:
        return []
    kept = [t for t in chosen if t in tasks] or sorted(tasks)
    why = f"{bundle} has the tasks {', '.join(sorted(tasks))}; every row naming another is refused."
    title = f"tasks not in the bundle: {', '.join(missing)}"
    return [Finding("error", tasks_path, title, why, _override(tasks_path, kept))]


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


def _mapping(ctx: _Context, path: str) -> dict[str, Any]:
    """A mapping from the config ({} when absent or null)."""
    value = ctx.config.get(path) or {}
    if not isinstance(value, dict):
        raise Unresolved(path, f"{value!r} is not a mapping")
    return value


def _as_int(value: object, path: str) -> int | None:
    number = _as_float(value, path)
    return None if number is None else int(number)


def _as_float(value: object, path: str) -> float | None:
    """A number from the config; strings count (`${oc.env:...}` gives strings), None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise Unresolved(path, f"{value!r} is not a number")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise Unresolved(path, f"{value!r} is not a number") from None


def _override(path: str, value: object) -> str:
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


_RULES: tuple[tuple[str, Callable[[_Context], list[Finding]]], ...] = (
    ("engine-max-tokens", _engine_max_tokens),
    ("admin-key", _admin_key),
    ("v1-paths", _v1_paths),
    ("micro-batches", _micro_batches),
    ("small-gpu", _small_gpu),
    ("decoupled-loss", _decoupled_loss),
    ("template-kwargs", _template_kwargs),
    ("proxy-budget", _proxy_budget),
    ("request-timeout", _request_timeout),
    ("workflow", _workflows),
)
RULES: tuple[str, ...] = tuple(rule_id for rule_id, _ in _RULES)


def check(
    config: Mapping[str, Any],
    *,
    env: Mapping[str, str],
    bundle_tasks: BundleTasks | None = None,
    gpu_memory_gb: float | None = None,
    token_counter_kwargs: Mapping[str, Any] | None = None,
    areal_version: str | None = None,
) -> list[Finding]:
    """Run every rule over a config from `load_config`; errors first, then warnings, then info.

    `env` resolves `${oc.env:...}` and stands for the trainer's environment. `bundle_tasks(path)`
    returns a bundle's {task_id: timeout_s} or raises ValueError (None: bundle contents unchecked).
    `gpu_memory_gb` is one GPU's memory (None: the small-GPU rules are skipped). `token_counter_kwargs`
    are the chat_template_kwargs modeltap's counter is given outside the config. `areal_version`
    defaults to the installed AReaL's. A value a rule needs but cannot resolve (an unset environment
    variable, say) skips that rule with an `info` finding.

        findings = check(load_config("grpo.yaml", []), env=os.environ, gpu_memory_gb=24)
    """
    ctx = _Context(
        config=Config(config, env),
        env=env,
        bundle_tasks=bundle_tasks,
        gpu_memory_gb=gpu_memory_gb,
        token_counter_kwargs=token_counter_kwargs,
        areal=capabilities(areal_version if areal_version is not None else installed_version()),
    )
    findings: list[Finding] = []
    skipped: dict[str, tuple[Unresolved, list[str]]] = {}
    for rule_id, rule in _RULES:
        try:
            findings.extend(replace(f, rule=rule_id) for f in rule(ctx))
        except Unresolved as exc:
            skipped.setdefault(exc.path, (exc, []))[1].append(rule_id)
    for path, (unresolved, rule_ids) in skipped.items():
        title = f"{path} could not be read, so {', '.join(rule_ids)} went unchecked"
        fix = f"++{path}=VALUE"
        if unresolved.needs:
            fix = f"export {unresolved.needs}=... as the trainer will have it, or {fix}"
        findings.append(Finding("info", path, title, unresolved.reason, fix, rule_ids[0]))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: order[f.severity])


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
        why = textwrap.fill(f.why, RENDER_WIDTH, initial_indent="  why: ", subsequent_indent="       ")
        lines += [f"{f.severity:<8}{f.path}", f"  {f.title}", why, f"  fix: {f.fix}", ""]
    lines.append(", ".join(f"{n} {s}{'' if n == 1 or s == 'info' else 's'}" for s, n in counts.items()))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `doctor` subcommand's arguments: config, overrides..., --json, --gpu-memory-gb,
    --areal-version, --chat-template-kwargs. Options go before the config or after the overrides."""
    parser.add_argument("config", help="the AReaL experiment YAML")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides: a.b=c, +a.b=c, ++a.b=c, ~a.b")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--gpu-memory-gb", type=float, help="one training GPU's memory, to check small-GPU settings"
    )
    parser.add_argument("--areal-version", help="the AReaL version the run uses (default: the installed one)")
    parser.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        help="the chat_template_kwargs modeltap's token counter gets, as JSON, if not in the config",
    )


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, such as '{\"enable_thinking\": false}'")
    return value
