"""The first hour, as a new user lives it, on a machine with no model server: every code block of the
README run as it is written. `make demo` from a copy of the repository; a fresh venv installed as the
quickstart says; `modeltap demo --model-only` as the model server, then the quickstart's agents and
SDKs through `modeltap serve` and the three debugging commands; the quickstart again against AReaL's
layout and a chat-only server on the same port; then the commands a user reaches for next. Each step
checks the promises the README makes of it, and the last test that no block went unrun.

The code blocks are read from README.md, not copied here: a change to the README that breaks a
user's first steps breaks this test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.agents import CLAUDE, CLAUDE_OFFLINE_ENV, CODEX, OPENCODE, OPENCODE_OFFLINE_ENV, TASK_PROMPT
from tests.standins.openai_like import OpenAILikeStandIn

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
# The blocks the journey has run, by text; `test_every_block_of_the_readme_ran` checks against the README.
RAN: set[str] = set()
# Lines of a block the journey does not run, with why.
NOT_RUN = {"make test": "the journey is one of the tiers it runs"}
MAKE_DEMO_TIMEOUT_S = 900
# Where a machine names the CA bundles its HTTPS clients trust (npm's, pip's, curl's, OpenSSL's).
TLS_VARIABLES = (
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "PIP_CERT",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
# What the quickstart's snippets name: the upstream's port and the model it serves.
UPSTREAM_PORT = 8000
MODEL = "Qwen2.5-Coder-7B-Instruct"
# A base install is the proxy and the readers: none of the extras' packages.
EXTRAS_ONLY = ("docker", "tokenizers", "tiktoken", "transformers", "jinja2", "opentelemetry-sdk", "openai")
# What the copy of the repository leaves out: caches, venvs and records, none of which a clone has.
NOT_IN_A_CLONE = shutil.ignore_patterns(
    ".git", ".venv*", ".cache", ".modeltap", "__pycache__", "*.egg-info", "build", ".coverage*"
)
INSTALL_TIMEOUT_S = 600
AGENT_TIMEOUT_S = 240
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class Block:
    """One fenced code block of the quickstart: its language and its text."""

    language: str
    text: str


def readme_blocks() -> list[Block]:
    """Every fenced code block of the README, in order."""
    return [
        Block(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", README.read_text(), re.S)
    ]


def quickstart() -> list[Block]:
    """The README's code blocks (the name the steps below read them by)."""
    return readme_blocks()


def block(blocks: list[Block], language: str, containing: str) -> str:
    """The one block of `language` holding `containing`, noted as run."""
    [found] = [b.text for b in blocks if b.language == language and containing in b.text]
    RAN.add(found)
    return found


def runnable(text: str) -> str:
    """A bash block less the lines NOT_RUN names (each said why)."""
    return "\n".join(line for line in text.splitlines() if not any(line.startswith(n) for n in NOT_RUN))


@dataclass
class User:
    """A new user's machine: a HOME of their own, a project folder, and the PATH the quickstart sets."""

    home: Path
    project: Path
    source: Path

    @property
    def env(self) -> dict[str, str]:
        venv_bin = self.home / ".venvs" / "modeltap" / "bin"
        return {
            "HOME": str(self.home),
            "PATH": f"{venv_bin}:{CLAUDE.parent}:{os.environ['PATH']}",
            "LANG": "C.UTF-8",
            # The user's pip and npm caches are the machine's (warm, as CI's are): the installs need the
            # registries, not a cold cache.
            "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
            "npm_config_cache": os.environ.get("npm_config_cache", str(Path.home() / ".npm")),
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            # The machine's TLS set-up (the CA bundle its registries' certificates chain to), as a user has it
            **{name: os.environ[name] for name in TLS_VARIABLES if name in os.environ},
        }

    def sh(self, script: str, *, cwd: Path | None = None, timeout: float = 120) -> str:
        """Run `script` in bash as the user; fail with its output when it fails. Returns stdout."""
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=cwd or self.project, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert run.returncode == 0, f"$ {script}\n{run.stdout}\n{run.stderr}"
        return run.stdout

    def run(
        self, script: str, *, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `script` in bash as the user, whatever its exit status."""
        return subprocess.run(
            ["bash", "-c", script],
            cwd=cwd or self.project, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    @contextmanager
    def background(self, script: str, ready: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
        """`script` running in the background until the block ends, once its stdout printed `ready`:
        the process and that line."""
        process = subprocess.Popen(
            ["bash", "-c", f"exec {script}"], cwd=self.project, env=self.env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            deadline = time.monotonic() + START_TIMEOUT_S
            seen = []
            for line in process.stdout:
                seen.append(line)
                if ready in line or time.monotonic() > deadline:
                    break
            assert any(ready in line for line in seen), f"{script} never printed {ready!r}:\n{''.join(seen)}"
            yield process, seen[-1].strip()
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> User:
    """A user who followed the install block: a venv with modeltap installed from a copy of the repo."""
    root = tmp_path_factory.mktemp("journey")
    someone = User(root / "home", root / "project", root / "modeltap")
    someone.home.mkdir()
    someone.project.mkdir()
    shutil.copytree(REPO, someone.source, ignore=NOT_IN_A_CLONE)
    install = block(quickstart(), "bash", "pip install")
    someone.sh(install, cwd=someone.source, timeout=INSTALL_TIMEOUT_S)
    return someone


@contextmanager
def port_free(port: int) -> Iterator[None]:
    """Fail at once when something already listens where the README's servers go."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            pytest.fail(f"port {port} is taken: the journey's model server needs it")
    yield


@pytest.mark.timeout(MAKE_DEMO_TIMEOUT_S + 60)
def test_make_demo_from_a_copy_of_the_repository(user: User) -> None:
    """The README's first command: only the openai SDK and opencode installed, the demo played."""
    commands = block(quickstart(), "bash", "make demo")
    shown = user.sh(runnable(commands), cwd=user.source, timeout=MAKE_DEMO_TIMEOUT_S)
    assert "turn 1: the model calls bash" in shown and "turn 2 (streamed): the model answers '42'" in shown
    assert "(exit 0)" in shown, shown  # opencode played through modeltap
    installed = {
        p["name"].lower() for p in json.loads(user.sh(f"{user.source}/.venv/bin/pip list --format json"))
    }
    assert "openai" in installed and not installed & {"transformers", "mypy", "hydra-core", "docker"}
    assert sorted(p.name for p in (user.source / ".cache" / "npm" / "node_modules" / ".bin").iterdir()) == [
        "opencode"
    ]


def test_a_base_install_is_the_proxy_and_the_readers(user: User) -> None:
    installed = user.sh("pip list --format json")
    names = {package["name"].lower() for package in json.loads(installed)}
    assert "modeltap" in names and "aiohttp" in names
    assert not names & set(EXTRAS_ONLY), f"a base install pulled in {sorted(names & set(EXTRAS_ONLY))}"
    assert user.sh("modeltap --version").startswith("modeltap ")


def test_the_quickstart_as_written_on_a_machine_with_no_model_server(user: User) -> None:
    blocks = quickstart()
    model = block(blocks, "bash", "modeltap demo --model-only").strip()
    with port_free(UPSTREAM_PORT), user.background(model, ready="listening on") as (_, listening):
        assert listening.endswith(f"http://127.0.0.1:{UPSTREAM_PORT}"), listening
        sessions, server_log = _agents_through_serve(user, blocks)
        debugging = user.sh(block(blocks, "bash", "modeltap sessions --errors"))
    # serve printed one line per exchange; each client is a session of its own.
    for client in ("opencode", "claude-code", "codex", "openai-python", "anthropic-python"):
        assert client in sessions, f"{client} has no session of its own:\n{sessions}"
    assert server_log.count(" 200 ") >= 8, server_log
    # The three debugging commands: the (empty) list of failed sessions, the newest turn by turn, the hits.
    lines = debugging.splitlines()
    assert lines[0].split()[:2] == ["SESSION", "STARTED"], debugging
    assert any(line.startswith("session ") and "turn(s)" in line for line in lines), debugging
    assert any(re.match(r"^\S+ #\d+ [\w ]+: .*echo \$\(\(6 \* 7\)\)", line) for line in lines), debugging


@pytest.mark.parametrize("upstream", ["areal-layout", "chat-only"])
def test_the_quickstart_as_written_against_areal_and_a_chat_only_server(user: User, upstream: str) -> None:
    """The same serve block, unchanged, in front of AReaL's layout (chat at the bare path, Messages at
    /v1/messages, no /v1/models) and of a server that speaks chat only (Responses and Messages
    translated): the SDK snippets and Claude Code get their answers."""
    blocks = quickstart()
    with port_free(UPSTREAM_PORT), _upstream(user, upstream):
        serve = block(blocks, "bash", "modeltap serve").strip()
        with user.background(serve, ready="listening on") as (server, _):
            for needle in ("from openai", "from anthropic"):
                printed = user.sh(f"{sys.executable} - <<'EOF'\n{block(blocks, 'python', needle)}\nEOF")
                assert printed.strip(), f"the {needle} snippet printed nothing against {upstream}"
            answer = _claude(user, blocks)
            assert json.loads(answer)["result"].strip() == "42", answer
        log = server.stderr.read() if server.stderr else ""
    assert " 200 " in log and " 404 " not in log and " 502 " not in log, log


@contextmanager
def _upstream(user: User, kind: str) -> Iterator[None]:
    """A model server on UPSTREAM_PORT: the scripted model laid out as AReaL's proxy, or a vLLM
    stand-in serving chat only."""
    if kind == "chat-only":
        server = OpenAILikeStandIn(model=MODEL, chat_only=True).start(UPSTREAM_PORT)
        try:
            yield
        finally:
            server.stop()
        return
    script = (
        "python -u -c 'from aiohttp import web; from modeltap.demo.model import model_app; "
        f'web.run_app(model_app(areal_layout=True), host="127.0.0.1", port={UPSTREAM_PORT})\''
    )
    with user.background(script, ready="Running on"):
        yield


def _agents_through_serve(user: User, blocks: list[Block]) -> tuple[str, str]:
    """The quickstart's serve block, then each agent and SDK snippet through it: `sessions`, and
    serve's stderr."""
    serve = block(blocks, "bash", "modeltap serve").strip()
    with user.background(serve, ready="listening on") as (server, _):
        (user.project / "opencode.json").write_text(block(blocks, "json", "opencode"))
        opencode = user.sh(
            f"env {_env(OPENCODE_OFFLINE_ENV)} {OPENCODE} run {_quote(TASK_PROMPT)}", timeout=AGENT_TIMEOUT_S
        )
        assert opencode.strip().endswith("42"), opencode

        answer = _claude(user, blocks)
        assert json.loads(answer)["result"].strip() == "42", answer

        (user.home / ".codex").mkdir(exist_ok=True)
        (user.home / ".codex" / "config.toml").write_text(block(blocks, "toml", "model_provider"))
        codex = user.sh(
            f"{CODEX} exec --skip-git-repo-check --sandbox danger-full-access {_quote(TASK_PROMPT)}",
            timeout=AGENT_TIMEOUT_S,
        )
        assert "42" in codex, codex

        for language, needle in (("python", "from openai"), ("python", "from anthropic")):
            printed = user.sh(f"{sys.executable} - <<'EOF'\n{block(blocks, language, needle)}\nEOF")
            assert printed.strip(), f"the {needle} snippet printed nothing"
        sessions = user.sh("modeltap sessions")
        assert sessions.count("\n") >= 5, sessions  # a header and a session per client at least
    return sessions, server.stderr.read() if server.stderr else ""


def _claude(user: User, blocks: list[Block]) -> str:
    """The README's Claude Code line, run headless on the task (its JSON answer)."""
    claude = block(blocks, "bash", "claude").strip()
    claude_home = user.home / ".claude"
    return user.sh(
        f"env {_env(CLAUDE_OFFLINE_ENV)} CLAUDE_CONFIG_DIR={claude_home} {claude} "
        f"-p {_quote(TASK_PROMPT)} --allowedTools Bash --output-format json",
        timeout=AGENT_TIMEOUT_S,
    )


def test_the_commands_a_user_reaches_for_next(user: User) -> None:
    """After the quickstart (its records): grep, stats, show, a strict mock and doctor, each saying
    what the first-hour issue promises."""
    rows = json.loads(user.sh("modeltap sessions --json"))
    by_client: dict[str, str] = {}
    for row in rows:  # newest first: a client's newest session (the openai SDK's model list is older)
        by_client.setdefault(row["labels"].get("client"), row["id"])
    assert {"opencode", "claude-code", "codex", "openai-python"} <= set(by_client), rows

    # grep: one line per hit, SESSION #TURN role: text around the match; exit status as grep's.
    hits = user.sh("modeltap grep 'echo \\$\\(\\(6'").splitlines()
    assert hits and all(re.match(r"^\S+ #\d+ [\w ]+: ", line) for line in hits), hits
    assert any(" tool call: → " in line and "echo $((6 * 7))" in line for line in hits), hits
    assert {line.split()[0] for line in hits} >= {by_client["opencode"], by_client["claude-code"]}
    nothing = user.run("modeltap grep -i 'no agent says this'")
    assert (nothing.returncode, nothing.stdout) == (1, ""), nothing

    # stats: per client, finish reasons and token percentiles.
    stats = user.sh("modeltap stats --label client").splitlines()
    assert stats[0].split()[:5] == ["CLIENT", "SESSIONS", "EXCHANGES", "PROMPT", "p50/p90/p99"], stats
    assert {line.split()[0] for line in stats[1:]} >= {"opencode", "claude-code", "codex", "openai-python"}
    assert all(re.search(r"\d+/\d+/\d+", line) for line in stats[1:]), stats
    assert any("tool_calls" in line for line in stats[1:]) and any("stop" in line for line in stats[1:])

    # show: tools named once, then collapsed; a system prompt seen before is one line.
    shown = user.sh(f"modeltap show {by_client['opencode']}")
    assert re.search(r"tools: \d+ offered \(bash, ", shown), shown
    assert re.search(r"tools: \d+ offered \([^)]*…\), as in turn \d+", shown), shown
    every = "\n".join(user.sh(f"modeltap show {sid}") for sid in by_client.values())
    assert re.search(r"\+ system +system prompt, [\d.]+k? chars, as in turn \d+", every), every

    # A strict mock: the recorded session is served, an off-script request gets a 409.
    sdk = by_client["openai-python"]
    mock = f"modeltap mock --session {sdk} --strict --port 0"
    with user.background(mock, ready="listening on") as (_, listening):
        off_script = urllib.request.Request(
            listening.split("listening on ")[1] + "/v1/chat/completions",
            data=json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "off script"}]}
            ).encode(),
            headers={"content-type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(off_script, timeout=30)
    assert refused.value.code == 409
    assert json.loads(refused.value.read())["error"]["code"] == "mock_off_script"

    # doctor on the example AReaL config: no errors, exit status 0.
    doctor = user.run("modeltap doctor examples/areal.yaml", cwd=user.source)
    assert doctor.returncode == 0 and "0 errors" in doctor.stdout, doctor


def _env(variables: dict[str, str]) -> str:
    return " ".join(f"{name}={_quote(value)}" for name, value in variables.items())


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def test_every_block_of_the_readme_ran() -> None:
    """Run last: a block the README shows that no step above ran is a promise nobody checks."""
    unrun = [b.text.splitlines()[0] for b in readme_blocks() if b.text not in RAN]
    assert unrun == [], f"README blocks no journey step runs: {unrun}"
