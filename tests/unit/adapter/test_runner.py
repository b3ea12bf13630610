"""modeltap/adapter/runner.py: one run's order, environments, answers, checks, judges and failures,
played in LocalSandboxes with shell agents (the opencode run is in tests/docker)."""

from __future__ import annotations

import contextlib
import json
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from modeltap.adapter import runner
from modeltap.adapter.bundle import Bundle, load_bundle
from modeltap.adapter.local_sandbox import LocalProvider
from modeltap.adapter.runner import RunFailed, RunPlan, SolverEndpoint, Unscored, play
from tests.standins.anthropic_like import AnthropicLikeStandIn
from tests.standins.openai_like import OpenAILikeStandIn
from tests.standins.script import Conversation, Reply
from tests.unit.adapter.test_sandbox import alive

SESSION = SolverEndpoint("http://127.0.0.1:9/s/TOKEN", None, "session-token")


def bundle_of(tmp_path: Path, text: str) -> Bundle:
    path = tmp_path / "bundle.toml"
    path.write_text(textwrap.dedent(text))
    return load_bundle(path)


def plan_for(
    bundle: Bundle, task_id: str, timeout_s: float = 30.0, judge_http: aiohttp.ClientSession | None = None
) -> RunPlan:
    task = bundle.tasks[task_id]
    return RunPlan(
        run_id=f"run-{task_id}",
        task=task,
        solver=bundle.solver_for(task),
        helpers=tuple(bundle.helper_agents(task)),
        judges=bundle.judges,
        endpoint=SESSION,
        timeout_s=timeout_s,
        judge_http=judge_http,
    )


ECHO_AGENT = """
solver = "echo"
[agents.echo]
command = ["sh", "-c", "echo \\"$ANSWER\\""]
env = {ANSWER = "${prompt}"}
"""


@pytest.mark.parametrize(
    ("checks", "score", "reward"),
    [
        ('[{exact = "42"}]', "mean", 1.0),
        ('[{exact = "41"}]', "mean", 0.0),
        ('[{contains = "4"}, {regex = "^43$"}]', "mean", 0.5),
        ('[{contains = "4", weight = 3.0}, {regex = "^43$"}]', "mean", 0.75),
        ('[{contains = "4"}, {regex = "^43$"}]', "all", 0.0),
        ('[{contains = "4"}, {regex = "^4\\\\d$"}]', "all", 1.0),
        ('[{command = "test \\"$MODELTAP_ANSWER\\" = 42"}]', "mean", 1.0),
        ('[{command = ["false"]}]', "mean", 0.0),
    ],
)
async def test_checks_score_the_answer_and_the_task_s_rule_combines_them(
    tmp_path: Path, checks: str, score: str, reward: float
) -> None:
    bundle = bundle_of(
        tmp_path, ECHO_AGENT + f'[[tasks]]\nid = "t"\nprompt = "42"\nscore = "{score}"\nchecks = {checks}\n'
    )
    result = await play(plan_for(bundle, "t"), LocalProvider())
    assert result.answer == "42"
    assert result.reward == reward and type(result.reward) is float


async def test_the_solver_gets_the_session_url_with_its_suffix_and_helpers_keep_their_own(
    tmp_path: Path,
) -> None:
    env_dump = 'env | grep -E "^(BASE|KEY|MODEL_URL)=" | sort > "$0.env"'
    bundle = bundle_of(
        tmp_path,
        f"""
        solver = "solver"
        [agents.solver]
        command = ["sh", "-c", '{env_dump}; echo done', "solver"]
        env = {{MODEL_URL = "${{base_url}}"}}
        endpoint = {{base_url_vars = ["BASE"], api_key_vars = ["KEY"], suffix = "/v1"}}
        [agents.reviewer]
        command = ["sh", "-c", '{env_dump}', "reviewer-${{task_id}}"]
        [agents.reviewer.endpoint]
        base_url_vars = ["BASE"]
        api_key_vars = ["KEY"]
        base_url = "http://judge.example/v1"
        api_key = "reviewer-key"
        [[tasks]]
        id = "t"
        prompt = "p"
        agents = [{{agent = "reviewer", prompt = "review ${{task_id}}", stage = "before"}}]
        checks = [{{command = "test -f solver.env && test -f reviewer-t.env"}}, {{exact = "done"}}]
        """,
    )

    class Keep(LocalProvider):
        async def open(self, spec):  # type: ignore[no-untyped-def]
            self.box = await super().open(spec)
            self.envs: dict[str, str] = {}
            original = self.box.close

            async def close() -> None:
                for name in ("solver", "reviewer-t"):
                    self.envs[name] = (Path(self.box.workdir) / f"{name}.env").read_text()
                await original()

            self.box.close = close  # type: ignore[method-assign]
            return self.box

    provider = Keep()
    result = await play(plan_for(bundle, "t"), provider)
    assert result.reward == 1.0
    url = "http://127.0.0.1:9/s/TOKEN/v1"
    assert provider.envs["solver"] == f"BASE={url}\nKEY=session-token\nMODEL_URL={url}\n"
    assert provider.envs["reviewer-t"] == "BASE=http://judge.example/v1\nKEY=reviewer-key\n"


async def test_a_solver_that_exits_non_zero_fails_the_run_with_its_output_in_the_logs(tmp_path: Path) -> None:
    bundle = bundle_of(
        tmp_path,
        """
        solver = "broken"
        [agents.broken]
        command = ["sh", "-c", "echo cannot reach the model >&2; exit 7"]
        [[tasks]]
        id = "t"
        prompt = "p"
        checks = [{exact = "x"}]
        """,
    )
    with pytest.raises(RunFailed) as caught:
        await play(plan_for(bundle, "t"), LocalProvider())
    assert caught.value.reason == "task 't': the solver 'broken' exited 7"
    assert "cannot reach the model" in str(caught.value)


async def test_a_run_past_its_limit_fails_and_leaves_no_process(tmp_path: Path) -> None:
    pid_file = tmp_path / "agent.pid"
    bundle = bundle_of(
        tmp_path,
        f"""
        solver = "slow"
        [agents.slow]
        command = ["sh", "-c", "echo $$ > {pid_file}; exec sleep 60"]
        [[tasks]]
        id = "t"
        prompt = "p"
        checks = [{{exact = "x"}}]
        """,
    )
    with pytest.raises(RunFailed, match=r"ran past its 0\.5 s limit"):
        await play(plan_for(bundle, "t", timeout_s=0.5), LocalProvider())
    assert not alive(int(pid_file.read_text()))


@pytest.mark.parametrize(
    ("answer", "command"),
    [
        ('{file = "answer.txt"}', '["echo", "42"]'),  # the file was never written
        ('"claude-json"', '["echo", "not json"]'),
        ('"opencode-json"', """["echo", '{"type":"step_start"}']"""),
        ('"codex-json"', """["echo", '{"type":"turn.failed"}']"""),
        ('"qwen-json"', """["echo", '[{"type":"system"}]']"""),
    ],
)
async def test_a_missing_answer_is_unscored_not_a_zero(tmp_path: Path, answer: str, command: str) -> None:
    bundle = bundle_of(
        tmp_path,
        f"""
        solver = "a"
        [agents.a]
        command = {command}
        answer = {answer}
        [[tasks]]
        id = "t"
        prompt = "p"
        checks = [{{exact = "42"}}]
        """,
    )
    with pytest.raises(Unscored, match="left no answer"):
        await play(plan_for(bundle, "t"), LocalProvider())


OPENCODE_EVENTS = [
    {"type": "step_start", "part": {}},
    {"type": "tool_use", "part": {"tool": "bash"}},
    {"type": "step_finish", "part": {"reason": "tool-calls"}},
    {"type": "step_start", "part": {}},
    {"type": "text", "part": {"text": "42"}},
    {"type": "step_finish", "part": {"reason": "stop"}},
]


CODEX_EVENTS = [
    {"type": "thread.started"},
    {"type": "item.completed", "item": {"type": "command_execution", "aggregated_output": "42\n"}},
    {"type": "item.completed", "item": {"type": "agent_message", "text": "42"}},
    {"type": "turn.completed", "usage": {}},
]
QWEN_OUTPUT = [
    {"type": "system"},
    {"type": "assistant"},
    {"type": "result", "result": "42", "is_error": False},
]


async def test_answers_are_read_from_opencode_events_claude_json_and_files(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in OPENCODE_EVENTS))
    (tmp_path / "claude.json").write_text(json.dumps({"type": "result", "result": " 42\n"}))
    (tmp_path / "codex.jsonl").write_text("".join(json.dumps(e) + "\n" for e in CODEX_EVENTS))
    (tmp_path / "qwen.json").write_text(json.dumps(QWEN_OUTPUT))
    bundle = bundle_of(
        tmp_path,
        f"""
        [agents.opencode]
        command = ["cat", "{tmp_path}/events.jsonl"]
        answer = "opencode-json"
        [agents.claude]
        command = ["cat", "{tmp_path}/claude.json"]
        answer = "claude-json"
        [agents.codex]
        command = ["cat", "{tmp_path}/codex.jsonl"]
        answer = "codex-json"
        [agents.qwen]
        command = ["cat", "{tmp_path}/qwen.json"]
        answer = "qwen-json"
        [agents.writer]
        command = ["sh", "-c", "echo ignored; echo 42 > out/answer.txt", "x"]
        answer = {{file = "out/answer.txt"}}
        [[tasks]]
        id = "opencode"
        prompt = "p"
        solver = "opencode"
        checks = [{{exact = "42"}}]
        [[tasks]]
        id = "claude"
        prompt = "p"
        solver = "claude"
        checks = [{{exact = "42"}}]
        [[tasks]]
        id = "codex"
        prompt = "p"
        solver = "codex"
        checks = [{{exact = "42"}}]
        [[tasks]]
        id = "qwen"
        prompt = "p"
        solver = "qwen"
        checks = [{{exact = "42"}}]
        """,
    )
    for task_id in ("opencode", "claude", "codex", "qwen"):
        assert (await play(plan_for(bundle, task_id), LocalProvider())).answer == "42"


SCORE_TEXT = "The answer is right but terse.\nSCORE: 0.75"


def judge_script(conversation: Conversation) -> Reply:
    return Reply(text=SCORE_TEXT if "Rubric:\nexact" in conversation.last_user_text else "no verdict")


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """One client for every judge call of a test, as the workflow shares one per process."""
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.fixture
def judges() -> Iterator[tuple[OpenAILikeStandIn, AnthropicLikeStandIn]]:
    with (
        OpenAILikeStandIn(script=judge_script, api_key="sk-judge") as openai_judge,
        AnthropicLikeStandIn(script=judge_script, api_key="sk-ant-judge") as anthropic_judge,
    ):
        yield openai_judge, anthropic_judge


async def test_judges_are_called_on_their_own_endpoint_with_their_key(
    tmp_path: Path, judges: tuple[OpenAILikeStandIn, AnthropicLikeStandIn], http: aiohttp.ClientSession
) -> None:
    openai_judge, anthropic_judge = judges
    bundle = bundle_of(
        tmp_path,
        ECHO_AGENT
        + f"""
        [judges.oa]
        base_url = "{openai_judge.v1_url}"
        model = "standin-model"
        api_key = "sk-judge"
        [judges.an]
        base_url = "{anthropic_judge.url}"
        model = "claude-standin"
        api = "anthropic"
        api_key = "sk-ant-judge"
        [[tasks]]
        id = "t"
        prompt = "42"
        checks = [{{judge = "oa", rubric = "exact"}}, {{judge = "an", rubric = "exact"}}, {{exact = "42"}}]
        """,
    )
    result = await play(plan_for(bundle, "t", judge_http=http), LocalProvider())
    assert result.scores == (0.75, 0.75, 1.0)
    assert [r.path for r in openai_judge.model_requests] == ["/v1/chat/completions"]
    assert [r.path for r in anthropic_judge.model_requests] == ["/v1/messages"]
    assert "Answer:\n42" in openai_judge.model_requests[0].body["messages"][0]["content"]
    assert any("SCORE: 0.75" in line for line in result.logs), result.logs


async def test_a_judge_without_a_score_line_leaves_the_run_unscored(
    tmp_path: Path, judges: tuple[OpenAILikeStandIn, AnthropicLikeStandIn], http: aiohttp.ClientSession
) -> None:
    openai_judge, _ = judges
    text = ECHO_AGENT + (
        f'[judges.oa]\nbase_url = "{openai_judge.v1_url}"\nmodel = "standin-model"\napi_key = "sk-judge"\n'
        '[[tasks]]\nid = "t"\nprompt = "42"\nchecks = [{judge = "oa", rubric = "vague"}]\n'
    )
    with pytest.raises(Unscored, match="judge 'oa' replied without a SCORE line") as caught:
        await play(plan_for(bundle_of(tmp_path, text), "t", judge_http=http), LocalProvider())
    assert "no verdict" in str(caught.value)


async def test_a_judge_that_is_down_fails_the_run(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    text = ECHO_AGENT + (
        '[judges.down]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n'
        '[[tasks]]\nid = "t"\nprompt = "42"\nchecks = [{judge = "down", rubric = "r"}]\n'
    )
    with pytest.raises(RunFailed, match=r"judge 'down' at http://127\.0\.0\.1:9/v1/chat/completions failed"):
        await play(plan_for(bundle_of(tmp_path, text), "t", judge_http=http), LocalProvider())


async def test_a_judge_answering_a_huge_body_fails_the_run_without_reading_it_all(
    tmp_path: Path, http: aiohttp.ClientSession, aiohttp_server: Any
) -> None:
    sent: list[int] = []

    async def file_server(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            for _ in range(1024):  # 64 MiB
                await response.write(b"[" * 65536)
                sent.append(65536)
        return response

    text = await _judged_by(aiohttp_server, "big", file_server)
    with pytest.raises(RunFailed, match=r"judge 'big' answered more than 4194304 bytes.*check its base_url"):
        await play(plan_for(bundle_of(tmp_path, text), "t", judge_http=http), LocalProvider())
    assert sum(sent) < 64 * 1024 * 1024  # the judge's client stopped reading


async def test_a_judge_answering_deeply_nested_json_fails_the_run(
    tmp_path: Path, http: aiohttp.ClientSession, aiohttp_server: Any
) -> None:
    async def nested(request: web.Request) -> web.Response:
        return web.Response(body=b"[" * 100_000, content_type="application/json")

    text = await _judged_by(aiohttp_server, "deep", nested)
    with pytest.raises(RunFailed, match=r"judge 'deep' at .* failed: RecursionError"):
        await play(plan_for(bundle_of(tmp_path, text), "t", judge_http=http), LocalProvider())


async def _judged_by(aiohttp_server: Any, judge: str, answer: Any) -> str:
    """A bundle whose one task is checked by judge `judge`, served by `answer` on a server of its own."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    server = await aiohttp_server(app)
    return ECHO_AGENT + (
        f'[judges.{judge}]\nbase_url = "http://127.0.0.1:{server.port}/v1"\nmodel = "m"\n'
        f'[[tasks]]\nid = "t"\nprompt = "42"\nchecks = [{{judge = "{judge}", rubric = "r"}}]\n'
    )


async def test_a_docker_solver_with_a_loopback_only_proxy_is_refused_with_the_fix(tmp_path: Path) -> None:
    class ContainerLike(LocalProvider):
        async def open(self, spec):  # type: ignore[no-untyped-def]
            box = await super().open(spec)
            box.endpoint_kind = "container"
            return box

    text = ECHO_AGENT + '[[tasks]]\nid = "t"\nprompt = "42"\nchecks = [{exact = "42"}]\n'
    with pytest.raises(RunFailed, match=r"loopback only.*proxy=\{'host': '0\.0\.0\.0'\}"):
        await play(plan_for(bundle_of(tmp_path, text), "t"), ContainerLike())


@pytest.mark.parametrize("reader", [runner._result_answer, runner._codex_answer, runner._opencode_answer])
def test_an_agent_printing_deeply_nested_json_leaves_no_answer_instead_of_crashing(reader: Any) -> None:
    assert reader("[" * 100_000) is None
    assert reader("\n".join(["{}", "[" * 100_000, "{}"])) is None
