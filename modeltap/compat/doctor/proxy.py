"""Rules on AReaL's agent proxy and modeltap's proxy in front of it: the admin key AReaL starts with
(admin-key), the paths online agents use (v1-paths), the chat-template kwargs both sides render with
(template-kwargs), and modeltap's token budget against AReaL's cap (proxy-budget).

Owns: those four rules, and finding the tokenizer and chat template AReaL is configured with. Does not
own: AReaL's cap itself (`Context.engine`; its own rule is in limits.py).
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path

from modeltap.compat.doctor.config import Unresolved
from modeltap.compat.doctor.context import Context, Finding, as_int, mapping, override

# AReaL's well-known default admin key (docs/areal.md §5.3).
DEFAULT_ADMIN_API_KEY = "areal-admin-key"
# Template kwargs whose absence means this value: Qwen3's template thinks unless told
# enable_thinking=False (docs/token-budgets.md §5.2).
TEMPLATE_KWARG_DEFAULTS: Mapping[str, object] = {"enable_thinking": True}
# Where AReaL's own tokenizer is named, most specific first (InferenceEngineConfig.tokenizer_path,
# BaseExperimentConfig.tokenizer_path, TrainEngineConfig.path).
TOKENIZER_KEYS = ("rollout.tokenizer_path", "tokenizer_path", "actor.path")


def admin_key(ctx: Context) -> list[Finding]:
    """The admin key AReaL's proxy starts with.

    With the default key on AReaL's network bind, AReaL 2.0 (and the 1.0.4 wheel) refuse to start
    (docs/areal.md §5.3, §7 row 3, §10.4). The scheduler always starts the proxy with --host 0.0.0.0,
    which AReaL resolves to the host's address, never loopback (docs/areal.md §5.3, §6)."""
    if not ctx.uses_agent_proxy:
        return []
    path = (
        "rollout.admin_api_key"
        if ctx.config.get("rollout._version") == "v2"
        else f"{ctx.agent}.admin_api_key"
    )
    if ctx.config.get(path, DEFAULT_ADMIN_API_KEY) != DEFAULT_ADMIN_API_KEY:
        return []
    fix = override(path, secrets.token_urlsafe(32))
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


def v1_paths(ctx: Context) -> list[Finding]:
    """Whether online agents can reach AReaL at base URLs ending in /v1.

    AReaL's v1 agent proxy serves chat only at the bare path, in every release and on main: an agent
    whose base URL ends in /v1 gets 404 {"detail":"Not Found"} (docs/areal.md §1.1.1, §2). The v2
    gateway (`rollout._version: v2`) serves chat at both paths, so online agents need nothing there
    (docs/areal.md §9). modeltap's workflow is immune either way; agents that reach AReaL themselves,
    in online mode, are not."""
    path = f"{ctx.agent}.mode"
    if ctx.config.get(path, "inline") != "online" or ctx.config.get("rollout._version") == "v2":
        return []
    why = (
        "In online mode the agents reach AReaL's agent proxy with their own base URLs. It serves chat "
        "only at /chat/completions (in 1.0.4, 2.0.0 and on main), so an agent configured the usual way "
        'for opencode or the openai SDK (a base URL ending in /v1) gets 404 {"detail":"Not Found"} on '
        "every request. The fix puts modeltap, which serves every endpoint with and without /v1, between "
        "them: give the agents the URLs it prints. Or run AReaL's v2 gateway (rollout._version: v2), "
        "which serves /v1/chat/completions too."
    )
    fix = "modeltap serve --upstream http://PROXY_HOST:PORT --layout areal --host 0.0.0.0"
    return [Finding("warning", path, "online agents that append /v1 will get 404 from AReaL", why, fix)]


def template_kwargs(ctx: Context) -> list[Finding]:
    """The chat-template kwargs of modeltap's token counter against AReaL's.

    modeltap's counter must render the chat template as AReaL does. AReaL's proxy strips
    chat_template_kwargs from every request (docs/areal.md §1.1.6, §5.1), so it renders with none:
    Qwen3 keeps thinking on, whatever the agent or the counter is told (docs/token-budgets.md §5.2)."""
    if not ctx.uses_agent_proxy:
        return []
    if ctx.token_counter_kwargs is not None:
        counter_path, counter = "--chat-template-kwargs", dict(ctx.token_counter_kwargs)
    else:
        modeltap = next((w for w in ctx.workflows if w.is_modeltap), None)
        if modeltap is None:
            return []
        counter_path = f"{modeltap.kwargs_key}.proxy.chat_template_kwargs"
        counter = mapping(ctx, counter_path)
    areal = mapping(ctx, f"{ctx.agent}.chat_template_kwargs")
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
    return [Finding("error", counter_path, title, why, _same_kwargs(ctx, counter_path, areal))]


def _same_kwargs(ctx: Context, counter_path: str, areal: dict[str, object]) -> str:
    """The fix that gives modeltap's counter AReaL's kwargs. In the config the old mapping is deleted
    first: Hydra merges a mapping given to `++key=` into the one already there."""
    if counter_path.startswith("--"):
        return f"{counter_path} {shlex.quote(json.dumps(areal))}"
    fixes = [shlex.quote(f"~{counter_path}")] if ctx.config.has(counter_path) else []
    return " ".join([*fixes, override(counter_path, areal)] if areal else fixes)


def proxy_budget(ctx: Context) -> list[Finding]:
    """modeltap's token budget against AReaL's cap.

    modeltap answers an over-long prompt with the 400 agents compact on only when it counts (a
    tokenizer) and knows AReaL's cap; otherwise the prompt reaches AReaL, which answers 500
    (docs/areal.md §4.1). Without a tokenizer modeltap's budget is off."""
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
            fix = override(f"{proxy}.tokenizer", _areal_tokenizer(ctx))
            findings.append(
                Finding("warning", f"{proxy}.tokenizer", "modeltap's token budget is off", why, fix)
            )
        cap = as_int(ctx.config.get(f"{proxy}.engine_max_tokens"), f"{proxy}.engine_max_tokens")
        if cap is None or cap > areal_cap:
            title = f"modeltap's budget does not hold to AReaL's cap of {areal_cap} tokens"
            why = (
                f"{proxy}.engine_max_tokens is {cap or 'unset'}, so modeltap lets through prompts that AReaL "
                f"(with engine_max_tokens at {areal_cap}, as it should be) refuses. {refusal}"
            )
            fix = override(f"{proxy}.engine_max_tokens", areal_cap)
            findings.append(Finding("warning", f"{proxy}.engine_max_tokens", title, why, fix))
    return findings


def _areal_tokenizer(ctx: Context) -> str:
    """The tokenizer AReaL is configured with, for a fix, or a placeholder when it cannot be read."""
    return next(_tokenizers(ctx), "PATH/TO/TOKENIZER")


def _chat_template(ctx: Context) -> str | None:
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


def _tokenizers(ctx: Context) -> Iterator[str]:
    """AReaL's tokenizer paths as configured, most specific first, skipping what cannot be resolved."""
    for key in TOKENIZER_KEYS:
        try:
            value = ctx.config.get(key)
        except Unresolved:
            continue
        if isinstance(value, str) and value:
            yield value
