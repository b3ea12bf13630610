"""Tests for modeltap/compat/doctor/ (the rules, `check`, `render`) and `modeltap doctor`'s command line
in modeltap/cli.py. Reading the YAML (compat/hydra.py) is tested in test_hydra.py.

Each file in tests/fixtures/doctor/ is the clean config with one pitfall; each must raise exactly its
rule's findings, and applying the finding's own fix must clear them. The bundle contents come from
the adapter's real loader, as `modeltap doctor` passes them.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from modeltap.adapter import load_bundle
from modeltap.cli import commands as cli
from modeltap.compat import doctor
from modeltap.compat.doctor import EXIT_ERRORS, RULES, Finding, check, exit_code, load_config, render
from modeltap.compat.doctor.config import Config, Unresolved

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "doctor"
ENV = {"MODELTAP_TEST_ADMIN_KEY": "Vb3x9W2kq0eR7nT4yZ1uA8sD5fG6hJ2lP0oI9uY7tR4"}


def bundle_tasks(path: str) -> dict[str, float]:
    """What cli.py hands doctor: the bundle's {task_id: timeout_s}, from the adapter's loader."""
    return {task.id: task.timeout_s for task in load_bundle(path).tasks.values()}


@pytest.fixture(autouse=True)
def in_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    # Bundle paths in the fixtures are relative, as they are to the directory AReaL starts in.
    monkeypatch.chdir(FIXTURES)


def run(name: str, overrides: list[str] | None = None, **inputs) -> list[Finding]:
    settings = {"env": ENV, "bundle_tasks": bundle_tasks, "gpu_memory_gb": 24.0}
    return check(load_config(f"{name}.yaml", overrides or []), **{**settings, **inputs})


def test_clean_config_has_no_findings():
    assert run("clean") == []


PITFALLS = [
    ("engine_max_tokens_unset", "engine-max-tokens", ["error"]),
    ("engine_max_tokens_over_window", "engine-max-tokens", ["error"]),
    ("admin_key_default", "admin-key", ["error"]),
    ("online_v1_agents", "v1-paths", ["warning"]),
    ("micro_batches_small", "micro-batches", ["error", "error"]),  # actor, and ref through ${...}
    ("small_gpu", "small-gpu", ["warning", "warning", "warning"]),
    ("decoupled_loss", "decoupled-loss", ["warning"]),
    ("thinking_mismatch", "template-kwargs", ["error"]),
    ("proxy_budget_off", "proxy-budget", ["warning"]),
    ("request_timeout_short", "request-timeout", ["error"]),
    ("workflow_not_found", "workflow", ["error"]),
    ("bundle_missing", "workflow", ["error"]),
    ("unknown_task", "workflow", ["error"]),
    ("unknown_key", "unknown-key", ["warning"]),
]


def test_every_rule_has_a_pitfall_fixture():
    assert {rule for _, rule, _ in PITFALLS} == set(RULES)
    assert {f"{name}.yaml" for name, _, _ in PITFALLS} | {"clean.yaml"} == {
        p.name for p in FIXTURES.glob("*.yaml")
    }


@pytest.mark.parametrize(("name", "rule", "severities"), PITFALLS)
def test_each_pitfall_raises_exactly_its_finding(name, rule, severities):
    findings = run(name)
    assert [(f.rule, f.severity) for f in findings] == [(rule, s) for s in severities]
    assert exit_code(findings) == (EXIT_ERRORS if "error" in severities else 0)
    for finding in findings:
        assert finding.path and finding.title and finding.why and finding.fix


# Every fix but two is config overrides: online agents are fixed by putting modeltap in their way, and
# only the user knows where the missing bundle is.
FIXED_IN_THE_CONFIG = [p for p in PITFALLS if p[0] not in ("online_v1_agents", "bundle_missing")]


@pytest.mark.parametrize(("name", "rule", "severities"), FIXED_IN_THE_CONFIG)
def test_each_fix_clears_its_finding(name, rule, severities):
    findings = run(name)
    if name == "workflow_not_found":  # the fix names modeltap's workflow, which also wants its kwargs
        assert findings[0].fix == "++workflow=modeltap.adapter.AgentWorkflow"
    fixes = [token for f in findings for token in shlex.split(f.fix)]
    assert all(token.startswith(("++", "~")) for token in fixes), fixes
    assert run(name, fixes) == []


def test_all_fixes_at_once_leave_nothing():
    pitfalls = [
        "rollout.agent.engine_max_tokens=null",
        "workflow_kwargs.proxy.engine_max_tokens=null",
        "actor.mb_spec.max_tokens_per_mb=10240",
        "rollout.request_timeout=600",
        "actor.use_decoupled_loss=true",
        "actor.optimizer_dtype=float32",
        "rollout.agent.admin_api_key=areal-admin-key",
    ]
    findings = run("clean", pitfalls)
    assert len({f.rule for f in findings}) == 7
    fixes = [token for f in findings for token in shlex.split(f.fix)]
    assert run("clean", pitfalls + fixes) == []


@pytest.mark.parametrize(
    ("name", "fix"),
    [
        # sglang.context_length 32768 minus SGLang's scheduler margin of 6
        ("engine_max_tokens_unset", "++rollout.agent.engine_max_tokens=32762"),
        ("engine_max_tokens_over_window", "++rollout.agent.engine_max_tokens=32762"),
        ("micro_batches_small", "++actor.mb_spec.max_tokens_per_mb=32762"),
        ("thinking_mismatch", "'~workflow_kwargs.proxy.chat_template_kwargs'"),
        ("proxy_budget_off", "++workflow_kwargs.proxy.engine_max_tokens=32762"),
        # long-refactor's 900 s plus the 300 s margin
        ("request_timeout_short", "++rollout.request_timeout=1200"),
        ("unknown_task", "'++workflow_kwargs.tasks=[add-2-3]'"),
        ("decoupled_loss", "++actor.use_decoupled_loss=false ++actor.recompute_logprob=true"),
    ],
)
def test_the_exact_fix(name, fix):
    assert run(name)[0].fix == fix


def test_admin_key_fix_is_a_fresh_secret():
    first, second = run("admin_key_default")[0].fix, run("admin_key_default")[0].fix
    assert re.fullmatch(r"\+\+rollout\.agent\.admin_api_key=[A-Za-z0-9_-]{43}", first)
    assert first != second


def test_admin_key_allowed_by_env_is_a_warning():
    findings = run("admin_key_default", env={**ENV, "AREAL_ALLOW_DEFAULT_ADMIN_KEY": "1"})
    assert [(f.rule, f.severity) for f in findings] == [("admin-key", "warning")]


def test_admin_key_of_the_v2_controller():
    findings = run("clean", ["+rollout._version=v2"])
    assert [(f.rule, f.path) for f in findings] == [("admin-key", "rollout.admin_api_key")]


def test_legacy_rollout_openai_section():
    # Older configs (inclusionAI/AReaL examples/agent_workflow/config.yaml) call it rollout.openai.
    config = load_config("clean.yaml")
    config["rollout"]["openai"] = config["rollout"].pop("agent")
    config["workflow_kwargs"]["proxy"]["engine_max_tokens"] = 32762
    del config["rollout"]["openai"]["engine_max_tokens"]
    findings = check(config, env=ENV, bundle_tasks=bundle_tasks, gpu_memory_gb=24.0)
    assert [(f.rule, f.path) for f in findings] == [("engine-max-tokens", "rollout.openai.engine_max_tokens")]


def test_vllm_window_margin_is_one():
    findings = run("clean", ["rollout.backend=vllm:d1p1t1", "+vllm.max_model_len=32768"])
    assert findings == []
    findings = run("clean", ["rollout.backend=vllm:d1p1t1", "+vllm.max_model_len=32762"])
    # the clean config's proxy reads AReaL's number through ${...}: both fixes propose the same one
    assert [f.fix for f in findings] == [
        "++rollout.agent.engine_max_tokens=32761",
        "++workflow_kwargs.proxy.engine_max_tokens=32761",
    ]


def test_engine_max_tokens_inside_sglang_margin_is_a_warning():
    # AReaL's own SWE example: engine_max_tokens = context_length - 1 (examples/swe/qwen3_30b_a3b_grpo.yaml)
    overrides = ["rollout.agent.engine_max_tokens=32767"]
    findings = run("clean", overrides)
    assert [(f.rule, f.severity) for f in findings] == [
        ("engine-max-tokens", "warning"),
        ("proxy-budget", "warning"),
    ]
    # fixes that touch the same number agree, so applying them all leaves nothing
    fixes = [token for f in findings for token in shlex.split(f.fix)]
    assert fixes == [
        "++rollout.agent.engine_max_tokens=32762",
        "++workflow_kwargs.proxy.engine_max_tokens=32762",
    ]
    assert run("clean", overrides + fixes) == []


def test_window_from_the_model_config():
    assert run("clean", ["sglang.context_length=null"]) == []
    findings = run("clean", ["sglang.context_length=null", "rollout.agent.engine_max_tokens=null"])
    # modeltap's proxy reads AReaL's (now unset) number through ${rollout.agent.engine_max_tokens}
    assert [(f.rule, f.severity) for f in findings] == [
        ("engine-max-tokens", "warning"),
        ("proxy-budget", "warning"),
    ]
    assert findings[0].fix == "++rollout.agent.engine_max_tokens=CONTEXT_LENGTH_MINUS_6"


def test_v1_paths_fix_is_a_modeltap_command():
    (finding,) = run("online_v1_agents")
    assert shlex.split(finding.fix)[:4] == ["modeltap", "serve", "--upstream", "http://PROXY_HOST:PORT"]
    assert "--layout areal" in finding.fix


def test_v1_paths_holds_for_every_release_of_the_v1_proxy_and_not_for_the_v2_gateway():
    """No AReaL's agent proxy serves /v1/chat/completions (1.0.4, 2.0.0, main), whatever its version
    says; the v2 gateway serves it, so an online v2 config (AReaL's own
    examples/experimental/inference_service/online_rollout.yaml) gets no finding."""
    assert [f.rule for f in run("online_v1_agents")] == ["v1-paths"]
    assert (
        run(
            "online_v1_agents",
            ["++rollout._version=v2", "++rollout.admin_api_key=${rollout.agent.admin_api_key}"],
        )
        == []
    )


def test_small_gpu_checks_only_what_the_backend_uses():
    assert run("small_gpu", gpu_memory_gb=80.0) == []
    findings = run("small_gpu", ["actor.backend=megatron:d1"])
    assert [f.path for f in findings] == ["actor.scheduling_spec.0.env_vars.PYTORCH_CUDA_ALLOC_CONF"]
    # the environment counts as well as the workers' env_vars
    assert (
        run(
            "small_gpu",
            ["actor.backend=megatron:d1"],
            env={**ENV, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        )
        == []
    )


def test_alloc_conf_fix_keeps_the_other_options():
    findings = run(
        "small_gpu",
        ["actor.backend=megatron:d1", "++actor.scheduling_spec.0.env_vars.PYTORCH_CUDA_ALLOC_CONF=x:1"],
    )
    token = shlex.split(findings[0].fix)[0]
    assert (
        token == '++actor.scheduling_spec.0.env_vars.PYTORCH_CUDA_ALLOC_CONF="x:1,expandable_segments:True"'
    )


def test_alloc_conf_without_scheduling_spec_is_an_export():
    findings = run("small_gpu", ["actor.backend=megatron:d1", "~actor.scheduling_spec"])
    assert findings[0].fix == "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"


def test_unknown_gpu_says_so():
    findings = run("clean", gpu_memory_gb=None)
    assert [(f.rule, f.severity) for f in findings] == [("small-gpu", "info")]


def test_template_kwargs_from_the_command_line():
    findings = run("clean", token_counter_kwargs={"enable_thinking": False})
    assert [(f.rule, f.path, f.fix) for f in findings] == [
        ("template-kwargs", "--chat-template-kwargs", "--chat-template-kwargs '{}'")
    ]
    assert run("clean", token_counter_kwargs={"enable_thinking": True}) == []


def test_template_kwargs_not_read_by_the_template(tmp_path):
    # A local tokenizer whose template never reads enable_thinking (Qwen2.5): the kwarg changes nothing.
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert run("thinking_mismatch", [f"actor.path={tmp_path}"]) == []
    (tmp_path / "chat_template.jinja").write_text("{% if enable_thinking is false %}x{% endif %}")
    assert [f.rule for f in run("thinking_mismatch", [f"actor.path={tmp_path}"])] == ["template-kwargs"]


def test_template_kwargs_with_an_unreadable_tokenizer_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert [f.rule for f in run("thinking_mismatch", [f"actor.path={tmp_path}"])] == ["template-kwargs"]


def test_template_kwargs_that_are_not_a_mapping():
    findings = run("clean", ["+workflow_kwargs.proxy.chat_template_kwargs=thinking"])
    assert [(f.rule, f.severity, f.path) for f in findings] == [
        ("template-kwargs", "info", "workflow_kwargs.proxy.chat_template_kwargs")
    ]


def test_request_timeout_uses_the_workflows_timeout_s():
    findings = run("clean", ["+workflow_kwargs.timeout_s=3600"])
    assert [(f.rule, f.severity, f.fix) for f in findings] == [
        ("request-timeout", "error", "++rollout.request_timeout=3900")
    ]
    # the bundle's tasks no longer matter once timeout_s replaces their limits
    assert run("request_timeout_short", ["+workflow_kwargs.timeout_s=200"]) == []


def test_request_timeout_just_under_the_margin_is_a_warning():
    findings = run("clean", ["rollout.request_timeout=1000"])
    assert [(f.rule, f.severity) for f in findings] == [("request-timeout", "warning")]


def test_invalid_bundle_reports_the_loaders_message(tmp_path):
    (tmp_path / "bad.toml").write_text("[[tasks]]\nprompt = 'no id'\n")
    findings = run("clean", [f"workflow_kwargs.bundle={tmp_path}/bad.toml"])
    assert [(f.rule, f.path) for f in findings] == [("workflow", "workflow_kwargs.bundle")]
    assert str(tmp_path / "bad.toml") in findings[0].why


def test_unresolved_environment_variable_skips_with_info():
    findings = run("clean", env={})
    assert [(f.rule, f.severity, f.path) for f in findings] == [
        ("admin-key", "info", "rollout.agent.admin_api_key")
    ]
    assert "MODELTAP_TEST_ADMIN_KEY" in findings[0].why
    assert findings[0].fix.startswith("export MODELTAP_TEST_ADMIN_KEY=")


def test_oc_env_default_is_used():
    findings = run("clean", ["rollout.agent.admin_api_key=${oc.env:NO_SUCH_VAR,areal-admin-key}"], env={})
    assert [(f.rule, f.severity) for f in findings] == [("admin-key", "error")]


def test_eval_workflow_is_checked_too():
    findings = run("clean", ["+eval_workflow=modeltap.adapter.nowhere.Agent"])
    assert [(f.rule, f.path, f.severity) for f in findings] == [("workflow", "eval_workflow", "error")]
    assert run("clean", ["+eval_workflow=${workflow}"]) == []


def test_workflow_of_a_package_not_installed_here():
    # Running doctor outside the trainer's environment (no AReaL here) cannot tell: info, not error.
    findings = run("clean", ["workflow=areal.workflow.openai.math_agent.MathAgent"])
    assert [(f.rule, f.severity) for f in findings] == [("workflow", "info")]
    assert "'areal' is not installed" in findings[0].title


# --- finding modules without importing them ------------------------------------------------------


@pytest.fixture
def explosive_package(tmp_path, monkeypatch):
    """A package whose import raises, like one whose __init__ pulls in torch: doctor must not run it."""
    package = tmp_path / "explosive"
    (package / "agents").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "agents" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "agents" / "coder.py").write_text(
        "from explosive.base import Base as _Base\n"
        "try:\n    from fast import Speedy\nexcept ImportError:\n    Speedy = None\n"
        "class CodingAgent(_Base):\n    class Inner:\n        pass\n"
        "def make():\n    Hidden = 1\n    return Hidden\n"
    )
    (package / "agents" / "lazy.py").write_text("def __getattr__(name):\n    raise AttributeError(name)\n")
    (package / "agents" / "star.py").write_text("from explosive.base import *\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "explosive.agents.coder"
    assert not any(name.startswith("explosive") for name in sys.modules)


@pytest.mark.parametrize(
    ("import_path", "found"),
    [
        ("explosive.agents.coder.CodingAgent", True),
        ("explosive.agents.coder._Base", True),
        ("explosive.agents.coder.Speedy", True),  # bound inside try/except at top level
        ("explosive.agents.coder.Inner", False),  # only inside a class
        ("explosive.agents.coder.Hidden", False),  # only inside a function
        ("explosive.agents.coder.ReviewAgent", False),
        ("explosive.agents.lazy.Anything", True),  # a module __getattr__: cannot tell, so no finding
        ("explosive.agents.star.Anything", True),  # a star import: cannot tell either
    ],
)
def test_workflow_found_without_importing(explosive_package, import_path, found):
    findings = run("workflow_not_found", [f"workflow={import_path}"])
    assert [f.rule for f in findings] == ([] if found else ["workflow"])


def test_workflow_module_missing(explosive_package):
    findings = run("workflow_not_found", ["workflow=explosive.agents.reviewer.ReviewAgent"])
    assert [f.title for f in findings] == ["workflow module 'explosive.agents.reviewer' not found"]
    assert findings[0].fix == "++workflow=PACKAGE.MODULE.CLASS"


def test_workflow_typo_gets_the_close_name(explosive_package):
    findings = run("workflow_not_found", ["workflow=explosive.agents.coder.CodingAgnt"])
    assert [f.fix for f in findings] == ["++workflow=explosive.agents.coder.CodingAgent"]


def test_a_workflow_in_a_namespace_package_is_found(explosive_package, tmp_path):
    """AReaL 2.0's areal/workflow/openai has no __init__.py: its examples/agent_workflow/config.yaml
    names areal.workflow.openai.math_agent.MathAgent, which made doctor crash with a KeyError."""
    folder = tmp_path / "explosive" / "agents" / "openai"
    folder.mkdir()
    (folder / "math_agent.py").write_text("class MathAgent:\n    async def run(self, data, **kw): ...\n")
    assert run("workflow_not_found", ["workflow=explosive.agents.openai.math_agent.MathAgent"]) == []
    findings = run("workflow_not_found", ["workflow=explosive.agents.openai.math_agent.MathAgnt"])
    assert [f.fix for f in findings] == ["++workflow=explosive.agents.openai.math_agent.MathAgent"]
    findings = run("workflow_not_found", ["workflow=explosive.agents.openai.MathAgent"])
    assert [(f.rule, f.severity) for f in findings] == [("workflow", "error")]
    assert "a namespace package" in findings[0].why


def test_a_rule_that_raises_is_an_info_finding_and_the_others_still_run(monkeypatch):
    def broken(ctx):
        """The workflow's import path."""
        raise KeyError("areal.workflow")

    monkeypatch.setattr(doctor, "_RULES", (("workflow", broken), *doctor._RULES[1:]))
    findings = run("clean", ["rollout.request_timeout=1000"])
    assert [(f.rule, f.severity) for f in findings] == [("request-timeout", "warning"), ("workflow", "info")]
    assert findings[1].title == "the workflow check failed on this config: KeyError: 'areal.workflow'"


def test_a_misspelt_workflow_key_is_reported_and_its_checks_still_run(tmp_path):
    """`worklfow:` used to leave the workflow unseen, so request-timeout (and every modeltap check)
    passed in silence."""
    config = tmp_path / "c.yaml"
    config.write_text(
        (FIXTURES / "clean.yaml").read_text().replace("workflow: modeltap", "worklfow: modeltap")
    )
    findings = check(
        load_config(str(config), ["+workflow_kwargs.timeout_s=3600"]),
        env=ENV,
        bundle_tasks=bundle_tasks,
        gpu_memory_gb=24.0,
    )
    assert sorted((f.rule, f.path) for f in findings) == [
        ("request-timeout", "rollout.request_timeout"),
        ("unknown-key", "worklfow"),
    ]


def test_the_unknown_key_fix_proposes_the_cap_the_engine_rule_proposes():
    """A misspelt engine_max_token of 32768 beside a 32768 window: the rename must not write back the
    32768 the engine-max-tokens rule says to lower to 32762."""
    findings = run("clean", ["~rollout.agent.engine_max_tokens", "++rollout.agent.engine_max_token=32768"])
    fixes = {f.rule: f.fix for f in findings}
    assert fixes["engine-max-tokens"] == "++rollout.agent.engine_max_tokens=32762"
    assert fixes["unknown-key"] == "'~rollout.agent.engine_max_token' ++rollout.agent.engine_max_tokens=32762"
    # a value that is already right is kept as written
    (finding,) = run("unknown_key", ["rollout.agent.engine_max_token=16000"])
    assert finding.fix.endswith("++rollout.agent.engine_max_tokens=16000")


def test_a_config_without_a_workflow_leaves_the_agent_proxy_rules_to_its_training_script():
    """AReaL's examples/math/gsm8k_grpo.yaml writes rollout.agent with the default admin key and no cap,
    and its training script trains an RLVRWorkflow, which never starts the proxy."""
    findings = run(
        "clean",
        [
            "~workflow",
            "~workflow_kwargs",
            "rollout.agent.admin_api_key=areal-admin-key",
            "~rollout.agent.engine_max_tokens",
        ],
    )
    assert [(f.rule, f.severity) for f in findings] == [("workflow", "info")]
    # online agents always go through the proxy
    online = run(
        "clean",
        [
            "~workflow",
            "~workflow_kwargs",
            "rollout.agent.admin_api_key=areal-admin-key",
            "rollout.agent.mode=online",
        ],
    )
    assert ("admin-key", "error") in [(f.rule, f.severity) for f in online]


# --- reading values ------------------------------------------------------------------------------


def test_interpolations_resolve(tmp_path):
    text = """
    a: {b: 4, c: "${a.b}", d: "x-${a.b}-${oc.env:NAME}", e: "${.b}", f: {g: "${..b}"}}
    h: "${a.f.g}"
    loop: "${loop}"
    rel: "${oc.decode:1}"
    missing: ???
    """
    (tmp_path / "c.yaml").write_text(text.replace("\n    ", "\n"))
    config = Config(load_config(str(tmp_path / "c.yaml")), {"NAME": "n"})
    assert config.get("a.c") == 4
    assert config.get("a.d") == "x-4-n"
    assert config.get("a.e") == 4
    assert config.get("a.f.g") == 4
    assert config.get("h") == 4
    assert config.get("missing", "default") == "default"
    with pytest.raises(Unresolved, match="cycle"):
        config.get("loop")
    with pytest.raises(Unresolved, match="resolver"):
        config.get("rel")
    with pytest.raises(Unresolved, match="needs the environment variable NAME") as error:
        Config(config._raw, {}).get("a.d")
    assert error.value.needs == "NAME"


# --- misspelt keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "path", "known"),
    [
        ("+rollout.agent.engine_max_token=32762", "rollout.agent.engine_max_token", "engine_max_tokens"),
        ("+actor.mb_spec.max_token_per_mb=32768", "actor.mb_spec.max_token_per_mb", "max_tokens_per_mb"),
        ("+rollout.request_timout=1800", "rollout.request_timout", "request_timeout"),
        ("+rollout.agent.admin-api-key=x", "rollout.agent.admin-api-key", "admin_api_key"),  # - for _
        ("+workflow_kwargs.task=[add-2-3]", "workflow_kwargs.task", "tasks"),
        ("+workflow_kwargs.proxy.tokeniser=x", "workflow_kwargs.proxy.tokeniser", "tokenizer"),
    ],
)
def test_a_misspelt_key_gets_did_you_mean_and_a_rename(override, path, known):
    findings = run("clean", [override])
    assert [(f.rule, f.severity, f.path) for f in findings] == [("unknown-key", "warning", path)]
    assert f"did you mean {known!r}?" in findings[0].title
    delete, rename = shlex.split(findings[0].fix)
    assert delete == f"~{path}"
    assert rename.startswith(f"++{path.rpartition('.')[0]}.{known}=")
    assert run("clean", [override, delete, rename]) == []


def test_the_rename_keeps_the_value_as_written():
    findings = run("clean", ["+workflow_kwargs.proxy.engine_max_token=${rollout.agent.engine_max_tokens}"])
    assert shlex.split(findings[0].fix)[1] == (
        '++workflow_kwargs.proxy.engine_max_tokens="${rollout.agent.engine_max_tokens}"'
    )
    # AReaL's cap is the one exception: its rename proposes what engine-max-tokens would (the two fixes
    # agree), so applying it leaves nothing to fix
    misspelt = ["+rollout.agent.engine_max_token=40000"]
    fixes = shlex.split(run("clean", misspelt)[0].fix)
    assert fixes[1] == "++rollout.agent.engine_max_tokens=32762"
    assert run("clean", misspelt + fixes) == []


@pytest.mark.parametrize(
    "override",
    [
        "++rollout.request_retries=5",  # AReaL's own fields next to ones doctor reads
        "+rollout.setup_timeout=120",
        "+rollout.agent.session_timeout_seconds=600",
        "+actor.scheduling_strategy={type: separation}",
        "+eval_workflow_kwargs.bundle=bundle.toml",
        "+gconfig.max_token=1",  # a section no rule reads: nothing to compare with
        "++workflow=areal.workflow.Other",  # not modeltap's workflow: its kwargs are its own business
    ],
)
def test_real_neighbours_are_not_taken_for_misspellings(override):
    assert "unknown-key" not in [f.rule for f in run("clean", [override])]


def test_a_misspelt_key_is_found_when_the_rule_reading_it_could_not_run():
    findings = run(
        "clean", ["sglang.context_length=${oc.env:CONTEXT_LENGTH}", "+actor.mb_spec.max_token_per_mb=1"]
    )
    assert [(f.rule, f.path) for f in findings] == [
        ("unknown-key", "actor.mb_spec.max_token_per_mb"),
        ("engine-max-tokens", "sglang.context_length"),  # the info naming the checks that did not run
    ]


def test_the_legacy_agent_section_is_compared_too():
    config = load_config("clean.yaml")
    config["rollout"]["openai"] = config["rollout"].pop("agent")
    config["rollout"]["openai"]["engine_max_token"] = 1
    findings = check(config, env=ENV, bundle_tasks=bundle_tasks, gpu_memory_gb=24.0)
    assert "rollout.openai.engine_max_token" in [f.path for f in findings if f.rule == "unknown-key"]


# --- rules that could not run ---------------------------------------------------------------------


def test_an_unreadable_value_names_the_check_it_stopped_in_words():
    (finding,) = run("clean", env={})
    assert (
        finding.title == "rollout.agent.admin_api_key could not be read, so the admin-key check did not run"
    )
    assert finding.why == (
        "${oc.env:MODELTAP_TEST_ADMIN_KEY} needs the environment variable MODELTAP_TEST_ADMIN_KEY. "
        "Not checked: the admin key AReaL's proxy starts with (admin-key)."
    )


def test_one_unreadable_value_names_every_check_it_stopped():
    findings = run("clean", ["sglang.context_length=${oc.env:CONTEXT_LENGTH}"])
    assert [(f.severity, f.path) for f in findings] == [("info", "sglang.context_length")]
    assert findings[0].title == (
        "sglang.context_length could not be read, so the engine-max-tokens, micro-batches and "
        "proxy-budget checks did not run"
    )
    assert "AReaL's engine_max_tokens against the backend's context window (engine-max-tokens)" in (
        findings[0].why
    )
    assert "the micro-batch size against the longest trajectory (micro-batches)" in findings[0].why
    assert "modeltap's token budget against AReaL's cap (proxy-budget)" in findings[0].why
    # the same environment as the trainer's, and the rules run
    assert (
        run(
            "clean",
            ["sglang.context_length=${oc.env:CONTEXT_LENGTH}"],
            env={**ENV, "CONTEXT_LENGTH": "32768"},
        )
        == []
    )


def test_a_missing_bundle_says_which_check_it_stopped():
    (finding,) = run("bundle_missing")
    assert finding.why.endswith(
        "Until this is fixed, doctor cannot check rollout.request_timeout against the longest episode "
        "(request-timeout)."
    )
    # with the bundle there, that check runs and finds the short timeout
    assert [f.rule for f in run("request_timeout_short")] == ["request-timeout"]


def test_every_rule_says_in_one_line_what_it_checks():
    for rule_id, rule in doctor._RULES:
        summary = (rule.__doc__ or "").strip().splitlines()[0]
        assert summary.endswith(".") and 20 <= len(summary) <= 90, (rule_id, summary)


# --- the shipped example --------------------------------------------------------------------------


def test_the_example_config_passes(monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # its bundle path is relative to where AReaL starts: a checkout
    monkeypatch.delenv("AREAL_ADMIN_KEY", raising=False)
    assert cli.main(["doctor", "examples/areal.yaml"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "0 errors, 0 warnings, 2 info"
    # with the trainer's environment and a large GPU there is nothing left to say
    config = load_config("examples/areal.yaml")
    env = {"AREAL_ADMIN_KEY": "Vb3x9W2kq0eR7nT4yZ1uA8sD5fG6hJ2lP0oI9uY7tR4"}
    assert check(config, env=env, bundle_tasks=bundle_tasks, gpu_memory_gb=80.0) == []
    # and with its v2 lines uncommented (rollout._version: v2, rollout.admin_api_key)
    v2 = ["++rollout._version=v2", "++rollout.admin_api_key=${oc.env:AREAL_ADMIN_KEY}"]
    assert (
        check(load_config("examples/areal.yaml", v2), env=env, bundle_tasks=bundle_tasks, gpu_memory_gb=80.0)
        == []
    )


# --- output ---------------------------------------------------------------------------------------


def test_render_text():
    findings = run("request_timeout_short") + run("decoupled_loss")
    text = render(findings, as_json=False)
    assert text.splitlines()[0] == "error   rollout.request_timeout"
    assert "  fix: ++rollout.request_timeout=1200" in text.splitlines()
    assert all(len(line) <= 100 for line in text.splitlines() if line.startswith(("  why", "       ")))
    assert text.splitlines()[-1] == "1 error, 1 warning, 0 info"


def test_render_json():
    findings = run("small_gpu")
    doc = json.loads(render(findings, as_json=True))
    assert doc["format"] == 1
    assert doc["counts"] == {"error": 0, "warning": 3, "info": 0}
    assert [Finding(**f) for f in doc["findings"]] == findings


# --- the command line -----------------------------------------------------------------------------


def test_options_may_come_among_the_overrides(monkeypatch, capsys):
    monkeypatch.setenv("MODELTAP_TEST_ADMIN_KEY", ENV["MODELTAP_TEST_ADMIN_KEY"])
    argv = ["doctor", "clean.yaml", "++seed=2", "--json", "+rollout.agent.engine_max_token=1"]
    assert cli.main([*argv, "--gpu-memory-gb", "80"]) == 0
    findings = json.loads(capsys.readouterr().out)["findings"]
    # the override after --json was applied, and --gpu-memory-gb after it was read (no small-GPU info)
    assert [(f["rule"], f["path"]) for f in findings] == [("unknown-key", "rollout.agent.engine_max_token")]


def test_the_command_line_reads_every_option(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_doctor", lambda args: seen.append(args) or 0)
    argv = ["--gpu-memory-gb", "24", "c.yaml", "++a.b=1", "--json", "~c", "--chat-template-kwargs", "{}"]
    assert cli.main(["doctor", *argv, "x=1"]) == 0
    (args,) = seen
    assert (args.config, args.overrides, args.json, args.gpu_memory_gb) == (
        "c.yaml",
        ["++a.b=1", "~c", "x=1"],
        True,
        24.0,
    )
    assert args.chat_template_kwargs == {}


@pytest.mark.parametrize(("value", "message"), [("[1]", "expected a JSON object"), ("{no", "not JSON")])
def test_chat_template_kwargs_must_be_a_json_object(value, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["doctor", "c.yaml", "--chat-template-kwargs", value])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_config_that_cannot_be_read_exits_2_naming_the_file(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("a: [\n")
    assert cli.main(["doctor", str(tmp_path / "bad.yaml")]) == 2
    assert f"{tmp_path / 'bad.yaml'}: not valid YAML" in capsys.readouterr().err
