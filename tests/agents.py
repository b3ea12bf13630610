"""Run the real agent CLIs (opencode, Claude Code, Codex CLI, Qwen Code, mini-swe-agent) fully offline
against a base URL.

Owns: where the binaries are (the project-local npm prefix and the .venv-mini venv that `make agents`
fills), the exact offline environment and command line of each (docs/agents.md §3.2, §4.1, §6.2,
§7.2, §8.2), and running one with a fresh HOME, stdin from /dev/null, a timeout that kills its whole
process group, and its output parsed. Does not own: what the base URL points at (a stand-in,
modeltap) or the assertions.

    run = run_opencode(upstream.v1_url, "sk-test", tmp_path / "proj")
    assert run.exit_code == 0, run.describe()
    assert run.final_text == "42"

A missing binary fails the test with the make target that installs it (never a skip). Tests whose
upstream runs on the test's own event loop use `arun_opencode` / `arun_claude`, which do not block it.
The builders (`opencode_command`, `claude_command`) serve the Docker tier too: give them the paths as
the container sees them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NPM_BIN = REPO_ROOT / ".cache" / "npm" / "node_modules" / ".bin"
OPENCODE = NPM_BIN / "opencode"
CLAUDE = NPM_BIN / "claude"
CODEX = NPM_BIN / "codex"
QWEN = NPM_BIN / "qwen"
MINI = REPO_ROOT / ".venv-mini" / "bin" / "mini"
INSTALL_TARGET = "make agents"
# The model name Codex, Qwen Code and mini-swe-agent ask for: the one the vLLM stand-in serves (it
# answers any other with model_not_found, as vLLM does).
MODEL = "standin-model"
# The variable Codex reads its provider's key from (`env_key` names it: docs/agents.md §6.2).
CODEX_KEY_VARIABLE = "MODELTAP_CLIENT_KEY"
# One session of each of Qwen Code's turns is plenty for the two-turn task; the cap stops a loop.
QWEN_MAX_TURNS = 6
MINI_STEP_LIMIT = 6

TASK_PROMPT = "Run the shell command `echo $((6 * 7))` and reply with only the number it prints."
# The provider and model opencode is configured with; any OpenAI-compatible base URL serves it.
OPENCODE_PROVIDER = "standin"
OPENCODE_MODEL = "standin-model"
# opencode sends `max_tokens` = the model's `limit.output` (docs/agents.md §3.5).
OPENCODE_CONTEXT_TOKENS = 128_000
OPENCODE_OUTPUT_TOKENS = 4096
# A successful run takes 0.5-4 s on an idle machine (docs/agents.md §1) and up to 20 s on a loaded one
# (opencode, measured here at load 5 on 2 cores); two minutes means something is stuck.
DEFAULT_TIMEOUT_S = 120.0
# Claude Code retries 5xx and even 401 for about 3 minutes by default; 2 retries fail in about 2 s
# (docs/agents.md §4.4). None leaves the CLI's own default.
DEFAULT_CLAUDE_RETRIES: int | None = 2
# How much of stdout/stderr/log `AgentRun.describe` shows.
DESCRIBE_TAIL_CHARS = 3000

# Without these, opencode fetches models.dev and npm-installs a plugin in the background, and Claude
# Code sends HEAD /api/hello and looks up api.anthropic.com (docs/agents.md §3.3, §4.2).
# npm_config_offline is the one switch that stops opencode's background npm install.
OPENCODE_OFFLINE_ENV = {
    "OPENCODE_DISABLE_AUTOUPDATE": "1",
    "OPENCODE_DISABLE_MODELS_FETCH": "1",
    "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    "OPENCODE_PURE": "1",
    "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
    "OPENCODE_DISABLE_SHARE": "1",
    "OPENCODE_DISABLE_CLAUDE_CODE": "1",
    "OPENCODE_DISABLE_EXTERNAL_SKILLS": "1",
    "npm_config_offline": "true",
}
# Qwen Code looks up Aliyun's telemetry host unless usage statistics are off (docs/agents.md §7.2).
QWEN_OFFLINE_ENV = {"QWEN_USAGE_STATISTICS_ENABLED": "0", "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
# mini-swe-agent: no first-run wizard, no cost lookup failure, no litellm cost-map fetch at import
# (docs/agents.md §8.2); one attempt per request, so a refused request fails the run at once.
MINI_OFFLINE_ENV = {
    "MSWEA_CONFIGURED": "true",
    "MSWEA_COST_TRACKING": "ignore_errors",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "MSWEA_SILENT_STARTUP": "1",
    "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
}
CLAUDE_OFFLINE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
}


@dataclass(frozen=True)
class AgentCommand:
    """A command line, its complete environment (nothing inherited), and the folder to run it in."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    home: Path
    answer_file: Path | None = None
    """Where the agent writes its answer, when not on stdout (mini-swe-agent's trajectory)."""


@dataclass(frozen=True)
class AgentRun:
    """The outcome of one CLI run. `exit_code` is None when the run hit its timeout and was killed.

    `output` holds stdout's JSON values: one event per line for opencode (`--format json`) and Codex
    (`exec --json`), one result object for Claude Code (`--output-format json`), the elements of Qwen
    Code's one array (`--output-format json`).
    """

    command: AgentCommand
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    output: list[Any]

    @property
    def timed_out(self) -> bool:
        """True when the run was killed at its timeout."""
        return self.exit_code is None

    @property
    def final_text(self) -> str | None:
        """The agent's last answer: opencode's last `text` event, Claude Code's and Qwen Code's
        `result`, Codex's last agent message, mini-swe-agent's submission."""
        if self.command.answer_file is not None:
            return _submission(self.command.answer_file)
        for event in reversed(self.output):
            if not isinstance(event, dict):
                continue
            if event.get("type") == "text":
                return str(event.get("part", {}).get("text"))
            if event.get("type") == "result":
                return str(event.get("result"))
            item = event.get("item")
            if (
                event.get("type") == "item.completed"
                and isinstance(item, dict)
                and item.get("type") == "agent_message"
            ):
                return str(item.get("text"))
        return None

    @property
    def log(self) -> str:
        """opencode's own log of the run (empty for Claude Code, which keeps none)."""
        path = self.command.home / ".local" / "share" / "opencode" / "log" / "opencode.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def describe(self) -> str:
        """A summary for assertion messages: command, exit, time, and the ends of stdout, stderr and log."""
        tail = DESCRIBE_TAIL_CHARS
        return (
            f"{' '.join(self.command.argv[:2])} exit={self.exit_code} in {self.duration_s:.1f}s"
            f"{' (timed out)' if self.timed_out else ''}\n"
            f"--- stdout ---\n{self.stdout[-tail:]}\n--- stderr ---\n{self.stderr[-tail:]}\n"
            f"--- log ---\n{self.log[-tail:]}"
        )


def _binary(path: Path) -> str:
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path.name} is not installed at {path}: run `{INSTALL_TARGET}` (part of `make test`)")
    return str(path)


def fresh_home(workdir: Path) -> Path:
    """A new empty HOME next to `workdir`, so each run starts with no config, cache or history."""
    workdir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{workdir.name}-home-", dir=workdir.parent))


def home_env(home: Path) -> dict[str, str]:
    """HOME and every XDG folder under `home`, plus what a shell tool needs (PATH, SHELL, LANG).

    Nothing else is inherited, so no key or proxy setting of the machine leaks into a run.
    """
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
    }


def opencode_config(base_url: str, api_key: str, model: str = OPENCODE_MODEL) -> dict[str, Any]:
    """opencode's inline config: one OpenAI-compatible provider at `base_url` (give it the `/v1` the
    upstream needs: opencode appends only `/chat/completions`)."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "autoupdate": False,
        "share": "disabled",
        "model": f"{OPENCODE_PROVIDER}/{model}",
        "small_model": f"{OPENCODE_PROVIDER}/{model}",
        "enabled_providers": [OPENCODE_PROVIDER],
        "provider": {
            OPENCODE_PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "Stand-in",
                "options": {"baseURL": base_url, "apiKey": api_key},
                "models": {
                    model: {
                        "name": "Stand-in model",
                        "tool_call": True,
                        "limit": {"context": OPENCODE_CONTEXT_TOKENS, "output": OPENCODE_OUTPUT_TOKENS},
                    }
                },
            }
        },
    }


def opencode_command(
    base_url: str,
    api_key: str,
    workdir: Path,
    home: Path,
    *,
    prompt: str = TASK_PROMPT,
    model: str = OPENCODE_MODEL,
    binary: str | None = None,
) -> AgentCommand:
    """`opencode run --format json PROMPT` with the offline environment of docs/agents.md §3.2."""
    env = {
        **home_env(home),
        **OPENCODE_OFFLINE_ENV,
        "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(base_url, api_key, model)),
    }
    argv = [binary or _binary(OPENCODE), "run", "--format", "json", prompt]
    return AgentCommand(argv, env, workdir, home)


def claude_command(
    base_url: str,
    api_key: str,
    workdir: Path,
    home: Path,
    *,
    prompt: str = TASK_PROMPT,
    bearer: bool = False,
    max_retries: int | None = DEFAULT_CLAUDE_RETRIES,
    model: str | None = None,
    binary: str | None = None,
) -> AgentCommand:
    """`claude -p PROMPT --allowedTools Bash --output-format json` with the offline environment.

    Give `base_url` without `/v1`: Claude Code always appends `/v1/messages?beta=true`. `bearer`
    sends the key as `Authorization: Bearer` (ANTHROPIC_AUTH_TOKEN) instead of `x-api-key`.
    `--allowedTools Bash`, because `--dangerously-skip-permissions` refuses to run as root.
    """
    key_variable = "ANTHROPIC_AUTH_TOKEN" if bearer else "ANTHROPIC_API_KEY"
    env = {
        **home_env(home),
        **CLAUDE_OFFLINE_ENV,
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        key_variable: api_key,
    }
    if max_retries is not None:
        env["CLAUDE_CODE_MAX_RETRIES"] = str(max_retries)
    argv = [binary or _binary(CLAUDE), "-p", prompt, "--allowedTools", "Bash", "--output-format", "json"]
    if model is not None:
        argv += ["--model", model]
    return AgentCommand(argv, env, workdir, home)


def _submission(path: Path) -> str | None:
    """mini-swe-agent's answer: the trajectory's `info.submission`, stripped (docs/agents.md §8.3)."""
    try:
        info = json.loads(path.read_text()).get("info", {})
    except (OSError, ValueError):
        return None
    submission = info.get("submission")
    return submission.strip() if isinstance(submission, str) else None


def codex_config(base_url: str, model: str = MODEL) -> str:
    """Codex's config.toml: one provider at `base_url` speaking Responses (give it the `/v1` the
    upstream needs: Codex appends only `/responses`), no retries, no plugins, no analytics, and a
    refused connection failing instead of waiting (docs/agents.md §6.2)."""
    return f"""model = "{model}"
model_provider = "modeltap"

[model_providers.modeltap]
name = "modeltap"
base_url = "{base_url}"
env_key = "{CODEX_KEY_VARIABLE}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[features]
plugins = false
unbounded_connection_retries = false
"""


def codex_command(
    base_url: str,
    api_key: str,
    workdir: Path,
    home: Path,
    *,
    prompt: str = TASK_PROMPT,
    model: str = MODEL,
    binary: str | None = None,
) -> AgentCommand:
    """`codex exec --json` with its config file in a scratch CODEX_HOME (written here: it must exist)."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(codex_config(base_url, model))
    (home / "tmp").mkdir(exist_ok=True)
    env = {
        **home_env(home),
        "CODEX_HOME": str(codex_home),
        "TMPDIR": str(home / "tmp"),
        CODEX_KEY_VARIABLE: api_key,
    }
    argv = [
        binary or _binary(CODEX),
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--sandbox",
        "danger-full-access",
    ]
    return AgentCommand([*argv, prompt], env, workdir, home)


def qwen_command(
    base_url: str,
    api_key: str,
    workdir: Path,
    home: Path,
    *,
    prompt: str = TASK_PROMPT,
    model: str = MODEL,
    binary: str | None = None,
) -> AgentCommand:
    """`qwen --auth-type openai --output-format json --yolo` (docs/agents.md §7.3); give `base_url` the
    `/v1` the upstream needs (Qwen Code appends only `/chat/completions`)."""
    env = {
        **home_env(home),
        **QWEN_OFFLINE_ENV,
        "OPENAI_API_KEY": api_key,
        "OPENAI_BASE_URL": base_url,
        "OPENAI_MODEL": model,
    }
    argv = [binary or _binary(QWEN), "--auth-type", "openai", "--output-format", "json", "--yolo"]
    return AgentCommand([*argv, "--max-session-turns", str(QWEN_MAX_TURNS), prompt], env, workdir, home)


def mini_command(
    base_url: str,
    api_key: str,
    workdir: Path,
    home: Path,
    *,
    prompt: str = TASK_PROMPT,
    model: str = MODEL,
    binary: str | None = None,
) -> AgentCommand:
    """`mini --yolo --exit-immediately` with its answer in a trajectory file (docs/agents.md §8.3); give
    `base_url` the `/v1` the upstream needs (litellm appends only `/chat/completions`)."""
    trajectory = home / "trajectory.json"
    env = {
        **home_env(home),
        **MINI_OFFLINE_ENV,
        "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".config" / "mini-swe-agent"),
    }
    argv = [binary or _binary(MINI), "-m", f"openai/{model}", "-t", prompt, "--yolo", "--exit-immediately"]
    argv += ["-o", str(trajectory), "-c", "mini.yaml", "-c", f"agent.step_limit={MINI_STEP_LIMIT}"]
    argv += ["-c", f"model.model_kwargs.api_base={base_url}", "-c", f"model.model_kwargs.api_key={api_key}"]
    return AgentCommand(argv, env, workdir, home, answer_file=trajectory)


def _parse_output(stdout: str) -> list[Any]:
    try:
        whole = json.loads(stdout)
    except ValueError:
        whole = None
    if isinstance(whole, list):  # Qwen Code prints one array
        return whole
    values = []
    for line in stdout.splitlines():
        try:
            values.append(json.loads(line))
        except ValueError:
            continue
    return values


def run(command: AgentCommand, timeout_s: float = DEFAULT_TIMEOUT_S) -> AgentRun:
    """Run `command` to the end or to `timeout_s` (then its process group is killed)."""
    command.cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    process = subprocess.Popen(
        command.argv,
        cwd=command.cwd,
        env=command.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
        exit_code: int | None = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        exit_code = None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return AgentRun(command, exit_code, stdout, stderr, time.monotonic() - started, _parse_output(stdout))


async def arun(command: AgentCommand, timeout_s: float = DEFAULT_TIMEOUT_S) -> AgentRun:
    """`run` without blocking the event loop; cancelling it kills the process group too."""
    command.cwd.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        *command.argv,
        cwd=command.cwd,
        env=command.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        exit_code: int | None = process.returncode
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = await process.communicate()
        exit_code = None
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    out = stdout.decode(errors="replace")
    return AgentRun(
        command,
        exit_code,
        out,
        stderr.decode(errors="replace"),
        time.monotonic() - started,
        _parse_output(out),
    )


def run_opencode(
    base_url: str, api_key: str, workdir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any
) -> AgentRun:
    """Run opencode once with a fresh HOME; `options` go to `opencode_command` (prompt, model)."""
    return run(opencode_command(base_url, api_key, workdir, fresh_home(workdir), **options), timeout_s)


def run_claude(
    base_url: str, api_key: str, workdir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any
) -> AgentRun:
    """Run Claude Code once with a fresh HOME; `options` go to `claude_command` (prompt, bearer, ...)."""
    return run(claude_command(base_url, api_key, workdir, fresh_home(workdir), **options), timeout_s)


async def arun_opencode(
    base_url: str, api_key: str, workdir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any
) -> AgentRun:
    """`run_opencode` without blocking the event loop."""
    return await arun(opencode_command(base_url, api_key, workdir, fresh_home(workdir), **options), timeout_s)


async def arun_claude(
    base_url: str, api_key: str, workdir: Path, *, timeout_s: float = DEFAULT_TIMEOUT_S, **options: Any
) -> AgentRun:
    """`run_claude` without blocking the event loop."""
    return await arun(claude_command(base_url, api_key, workdir, fresh_home(workdir), **options), timeout_s)


Builder = Callable[..., AgentCommand]


async def arun_agent(
    build: Builder,
    base_url: str,
    api_key: str,
    workdir: Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    **options: Any,
) -> AgentRun:
    """Any agent's command (`codex_command`, `qwen_command`, `mini_command`, ...) run once with a fresh
    HOME, without blocking the event loop."""
    return await arun(build(base_url, api_key, workdir, fresh_home(workdir), **options), timeout_s)
