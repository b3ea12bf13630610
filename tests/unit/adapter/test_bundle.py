"""modeltap/adapter/bundle.py: the bundle format and its validation errors."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modeltap.adapter.bundle import Answer, BundleError, Check, load_bundle, path_inside

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "bundle.toml"

MINIMAL = """
solver = "sh"
[agents.sh]
command = ["sh", "-c", "echo ${prompt}"]
[[tasks]]
id = "t1"
prompt = "say 5"
checks = [{exact = "5"}]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bundle.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_example_bundle_loads_with_its_opencode_agent_and_tasks() -> None:
    bundle = load_bundle(EXAMPLE)
    assert {"shell-smoke", "add-2-3", "mul-7-8", "write-sum"} <= set(bundle.tasks)
    opencode = bundle.solver_for(bundle.tasks["shell-smoke"])
    assert opencode.name == "opencode"
    assert opencode.answer == Answer("opencode-json")
    assert opencode.endpoint.suffix == "/v1"
    mounts = {mount.name: mount for mount in opencode.mounts}
    # Relative sources resolve against the bundle's directory, not the working directory.
    assert mounts["npm"].source == (EXAMPLE.parent / "../.cache/npm/node_modules").resolve()
    assert mounts["npm"].read_only and mounts["usr"].target == "/usr"
    assert bundle.tasks["write-sum"].checks[0] == Check("command", ("sh", "-c", 'test "$(cat sum.txt)" = 42'))


def test_defaults_fill_what_a_minimal_bundle_leaves_out(tmp_path: Path) -> None:
    bundle = load_bundle(write(tmp_path, MINIMAL))
    task = bundle.tasks["t1"]
    assert (task.timeout_s, task.train, task.score, task.solver) == (600.0, True, "mean", None)
    agent = bundle.solver_for(task)
    assert (agent.workdir, agent.answer.kind, agent.image) == ("/work", "stdout", None)


def test_an_agent_override_replaces_the_solver_and_must_exist(tmp_path: Path) -> None:
    bundle = load_bundle(write(tmp_path, MINIMAL + '[agents.other]\ncommand = ["true"]\n'))
    assert bundle.solver_for(bundle.tasks["t1"], "other").name == "other"
    with pytest.raises(BundleError, match="'nobody', which is not one of 'sh', 'other'"):
        bundle.solver_for(bundle.tasks["t1"], "nobody")


def test_an_unknown_task_id_names_the_tasks_that_exist(tmp_path: Path) -> None:
    bundle = load_bundle(write(tmp_path, MINIMAL))
    with pytest.raises(BundleError, match=r"no task 'nope'; the bundle has 't1'.*task_rows"):
        bundle.task("nope")
    with pytest.raises(BundleError, match="no task None"):
        bundle.task(None)


def test_judges_read_their_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRADER_KEY", "sk-grader")
    text = MINIMAL + '[judges.g]\nbase_url = "http://j/v1"\nmodel = "m"\napi_key_from_env = "GRADER_KEY"\n'
    judge = load_bundle(write(tmp_path, text)).judges["g"]
    assert (judge.api_key, judge.api, judge.model) == ("sk-grader", "openai", "m")


# Each broken bundle, and what its error must say: where the problem is and how to fix it.
ERRORS = [
    ("solver = 1\n" + MINIMAL.replace('solver = "sh"', ""), r"the file has solver = 1; it must be a string"),
    (MINIMAL + "extra = 1\n", r"tasks\[0\] \(id 't1'\) has unknown key\(s\) extra; allowed here: id, prompt"),
    (MINIMAL.replace('command = ["sh", "-c", "echo ${prompt}"]', ""), r"\[agents\.sh\] has no command; add"),
    (MINIMAL.replace("command", "comand"), r"\[agents\.sh\] has unknown key\(s\) comand"),
    (MINIMAL.replace("echo ${prompt}", "echo ${promt}"), r"unknown template variable\(s\) \['promt'\]"),
    (MINIMAL.replace("echo ${prompt}", "echo ${HOME:-/}"), r"malformed \$\{…\}.*write \$\$\{ for a literal"),
    (MINIMAL + '[[tasks]]\nid = "t1"\nprompt = "x"\nchecks = [{exact = "1"}]\n', r"repeats the id 't1'"),
    (MINIMAL.replace('checks = [{exact = "5"}]', ""), r"\(id 't1'\) has no checks, so its runs could never"),
    (MINIMAL.replace('{exact = "5"}', '{exact = "5", contains = "5"}'), r"exactly one of .* \(it has"),
    (MINIMAL.replace('{exact = "5"}', '{regex = "(("}'), r"checks\[0\] has a regex that does not compile"),
    (
        MINIMAL.replace('{exact = "5"}', '{judge = "g", rubric = "r"}'),
        r"judge check naming 'g'.*add \[judges\.g\]",
    ),
    (
        MINIMAL.replace('{exact = "5"}', '{exact = "5", rubric = "r"}'),
        r"has a rubric, which only a judge check",
    ),
    (MINIMAL.replace('solver = "sh"', 'solver = "zsh"'), r"solver = 'zsh' is not one of 'sh'"),
    (MINIMAL.replace('id = "t1"', 'id = "t1"\ntimeout_s = -1'), r"timeout_s = -1.0; it must be positive"),
    (MINIMAL.replace('id = "t1"', 'id = "t1"\ntimeout_s = true'), r"timeout_s = True; it must be a number"),
    (MINIMAL.replace('id = "t1"', 'id = "t1"\nscore = "max"'), r"score = 'max'; use one of 'mean', 'all'"),
    (MINIMAL + 'answer = "json"\n', r"unknown key\(s\) answer"),
    (
        MINIMAL.replace('command = ["sh"', 'answer = "json"\ncommand = ["sh"'),
        r"\[agents\.sh\] has answer = 'json'; use one of stdout, opencode-json, claude-json, codex-json, "
        r"qwen-json or \{file",
    ),
    (
        MINIMAL.replace('command = ["sh"', 'answer = {file = "../../etc/hostname"}\ncommand = ["sh"'),
        r"\[agents\.sh\] has answer = \{file = '\.\./\.\./etc/hostname'\}; the answer file is a path inside "
        r"the agent's workdir: relative, without \"\.\.\"",
    ),
    (
        MINIMAL.replace('command = ["sh"', 'answer = {file = "/etc/hostname"}\ncommand = ["sh"'),
        r"the answer file is a path inside the agent's workdir",
    ),
    (
        MINIMAL.replace('command = ["sh"', 'mounts = {m = {source = "/x", target = "rel"}}\ncommand = ["sh"'),
        r"\[agents\.sh\.mounts\.m\] has target 'rel'; a mount target is an absolute path",
    ),
    (
        MINIMAL.replace('id = "t1"', 'id = "t1"\nagents = [{agent = "sh", prompt = "review"}]'),
        r"agent 'sh' runs as a helper of task 't1' but has no endpoint\.base_url",
    ),
    (
        MINIMAL
        + '[judges.g]\nbase_url = "http://j"\nmodel = "m"\napi_key_from_env = "MODELTAP_TEST_UNSET_KEY"\n',
        r"\[judges\.g\] reads its key from \$MODELTAP_TEST_UNSET_KEY, which is not set; export it",
    ),
    ("[[tasks]\n", r"not valid TOML .*fix the syntax"),
    ('solver = "sh"\n', r"the file has no \[\[tasks\]\]; add at least one task"),
]


@pytest.mark.parametrize(("text", "message"), ERRORS)
def test_every_validation_error_names_the_file_the_entry_and_the_fix(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(BundleError, match=message) as caught:
        load_bundle(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert isinstance(caught.value, ValueError)


def test_a_missing_file_says_to_check_the_path(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"nope\.toml: cannot read the bundle .*check the bundle= path"):
        load_bundle(tmp_path / "nope.toml")


@given(
    st.lists(st.sampled_from(["a", "b.txt", "..", ".", "", "/", "\0", "~"]) | st.text(max_size=3)).map(
        "/".join
    )
)
def test_path_inside_names_a_file_under_the_directory_or_nothing(path: str) -> None:
    parts = path_inside(path)
    if parts is None:
        return
    assert parts and all(
        part not in ("", ".", "..") and "/" not in part and "\0" not in part for part in parts
    )
    assert PurePosixPath(*parts) == PurePosixPath(path)  # the same path, only spelled plainly
    assert os.path.normpath(os.path.join("/work", *parts)).startswith("/work/")
