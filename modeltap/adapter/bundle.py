"""The bundle file: the agents, judges and tasks an AgentWorkflow plays, read from one TOML file.

Owns: the file format, its validation (every error names the file, the entry and the fix) and the
template variables agents' commands and environments may use. Does not own: running anything
(runner.py, sandbox.py) or the process-wide cache of loaded bundles (workflow.py).

The format, in full (examples/bundle.toml is a runnable one):

    solver = "opencode"            # default solver of tasks that name none
    timeout_s = 300                # default limit on one run of a task

    [agents.opencode]
    image = "modeltap-agent:local" # the sandbox image (DockerSandbox); LocalSandbox ignores it
    command = ["${mount_npm}/.bin/opencode", "run", "--format", "json", "${prompt}"]
    workdir = "/work"              # where the command runs, and command checks with it
    answer = "opencode-json"       # stdout | opencode-json | claude-json | codex-json | qwen-json
                                   # | {file = "answer.txt"}
    env = {HOME = "/tmp/home", OPENCODE_CONFIG_CONTENT = '{… "baseURL": "${base_url}" …}'}
    mounts = {npm = {source = "../node_modules", target = "/opt/npm"}}   # read_only = true by default
    # How a model endpoint reaches the agent: the variables set to the base URL and the key, and the
    # suffix its client needs (opencode and the openai SDK add no /v1 themselves).
    endpoint = {base_url_vars = ["OPENAI_BASE_URL"], api_key_vars = ["OPENAI_API_KEY"], suffix = "/v1"}
    # Its own endpoint, used whenever it is not the solver (a solver's traffic goes through the proxy):
    # endpoint = {base_url = "http://…", api_key_from_env = "REVIEWER_KEY", model = "…"}

    [judges.grader]                # a model endpoint that scores answers; called directly, never proxied
    base_url = "http://judge:8000/v1"
    model = "grader-1"
    api_key_from_env = "GRADER_KEY"   # or api_key = "…"; api = "openai" (default) | "anthropic"

    [[tasks]]
    id = "add-2-3"
    prompt = "What is 2 + 3? Reply with the number only."
    solver = "opencode"            # optional: else the bundle's `solver`
    timeout_s = 120                # optional
    train = true                   # optional: false keeps it out of task_rows (evaluation only)
    score = "mean"                 # optional: weighted mean of the checks, or "all" (1.0 iff all pass)
    agents = [{agent = "reviewer", prompt = "…", stage = "after"}]   # optional: other agents, own endpoints
    checks = [{exact = "5"}, {contains = "5"}, {regex = '^\\s*5\\s*$'}, {command = "test -f out.txt"},
              {judge = "grader", rubric = "…", weight = 2.0}]

Template variables in `command`, `env` values and helper prompts: ${prompt}, ${task_id}, ${base_url}
(with the endpoint's suffix), ${api_key}, ${model}, ${workdir}, ${home} (a fresh home directory for the
run) and ${mount_NAME} (the mount's target in a container, its source on the host). Only `${name}` is a
variable: a bare `$` is left alone, so shell in commands (`$HOME`, `$((6 * 7))`, `$$`) needs no escaping;
`$${` is a literal `${`.
"""

from __future__ import annotations

import os
import re
import string
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal, cast

AnswerKind = Literal["stdout", "opencode-json", "claude-json", "codex-json", "qwen-json", "file"]
CheckKind = Literal["contains", "regex", "exact", "command", "judge"]
ANSWER_KINDS: tuple[AnswerKind, ...] = ("stdout", "opencode-json", "claude-json", "codex-json", "qwen-json")
CHECK_KINDS: tuple[CheckKind, ...] = ("contains", "regex", "exact", "command", "judge")
TEMPLATE_VARIABLES = frozenset({"prompt", "task_id", "base_url", "api_key", "model", "workdir", "home"})
# Long enough for an agent CLI to start, make a few model calls and run a tool; short enough that a
# hung sandbox frees its slot well within AReaL's default request_timeout of 3600 s
# (docs/areal.md §4.3).
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_WORKDIR = "/work"


# `${name}` is a variable and `$${` a literal `${`; any other `$` is left alone (`named` never matches),
# so shell in commands and JSON in environments need no escaping.
_TEMPLATE_PATTERN = r"""
\$(?:
    (?P<escaped>\$(?=\{))             |  # $${ -> ${
    \{(?P<braced>[_a-z][_a-z0-9]*)\}   |  # ${name}
    (?P<named>(?!))                   |
    (?P<invalid>\{)                      # ${ that is not ${name}
)
"""


class Template(string.Template):
    """The bundle's templates: `${name}` is a variable and `$${` a literal `${`; every other `$` stays."""

    # string.Template compiles a str pattern when the subclass is created.
    pattern = _TEMPLATE_PATTERN  # type: ignore[assignment]


class BundleError(ValueError):
    """A bundle that cannot be used as written. The message names the file, the entry and the fix."""


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path made visible to the agent: bind-mounted in a container, used in place on the host."""

    name: str
    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class Endpoint:
    """How a model endpoint reaches an agent, and the agent's own endpoint when it is not the solver."""

    base_url_vars: tuple[str, ...] = ()
    api_key_vars: tuple[str, ...] = ()
    suffix: str = ""
    base_url: str | None = None
    api_key: str | None = None
    model: str | None = None


def path_inside(path: str) -> tuple[str, ...] | None:
    """The components of `path` as a path inside a directory, or None when it names no file there:
    absolute, through "..", the directory itself, or holding a NUL. Lexical only: the sandboxes
    refuse links on the way when they open it.

    >>> path_inside("out/answer.txt"), path_inside("../../etc/hostname")
    (('out', 'answer.txt'), None)
    """
    pure = PurePosixPath(path)
    if "\0" in path or pure.is_absolute() or ".." in pure.parts or not pure.parts:
        return None
    return pure.parts


@dataclass(frozen=True, slots=True)
class Answer:
    """Where an agent's answer is read from: its stdout, its JSON event stream, or a file it writes
    (`path`, inside the agent's workdir: see path_inside)."""

    kind: AnswerKind
    path: str | None = None


@dataclass(frozen=True, slots=True)
class Agent:
    """A command-line agent and the sandbox it runs in."""

    name: str
    command: tuple[str, ...]
    image: str | None = None
    workdir: str = DEFAULT_WORKDIR
    answer: Answer = Answer("stdout")
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    endpoint: Endpoint = Endpoint()


@dataclass(frozen=True, slots=True)
class Judge:
    """A model endpoint that scores answers. Its calls go straight to it, never through the proxy."""

    name: str
    base_url: str
    model: str
    api_key: str | None = None
    api: Literal["openai", "anthropic"] = "openai"


@dataclass(frozen=True, slots=True)
class Check:
    """One scoring rule. `expected` is the text, pattern, command or rubric, by `kind`; `judge` names the
    judge of a judge check."""

    kind: CheckKind
    expected: str | tuple[str, ...]
    weight: float = 1.0
    judge: str | None = None


@dataclass(frozen=True, slots=True)
class Helper:
    """Another agent of a task, run in the same sandbox before or after the solver on its own endpoint."""

    agent: str
    prompt: str
    stage: Literal["before", "after"] = "after"


@dataclass(frozen=True, slots=True)
class Task:
    """One playable task: the solver's prompt, its checks and its limits."""

    id: str
    prompt: str
    checks: tuple[Check, ...]
    solver: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    train: bool = True
    score: Literal["mean", "all"] = "mean"
    helpers: tuple[Helper, ...] = ()


@dataclass(frozen=True, slots=True)
class Bundle:
    """A loaded, validated bundle. Build it with `load_bundle(path)`.

    >>> bundle = load_bundle("examples/bundle.toml")
    >>> bundle.solver_for(bundle.tasks["add-2-3"]).name
    'opencode'
    """

    path: Path
    agents: Mapping[str, Agent]
    judges: Mapping[str, Judge]
    tasks: Mapping[str, Task]
    solver: str | None = None

    def task(self, task_id: object) -> Task:
        """The task named `task_id`, or a BundleError listing the ones that exist."""
        task = self.tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise BundleError(
                f"{self.path}: no task {task_id!r}; the bundle has {_listed(self.tasks)}. Give each "
                "dataset row a task_id from the bundle (task_rows() builds such rows)"
            )
        return task

    def solver_for(self, task: Task, override: str | None = None) -> Agent:
        """The agent that solves `task`: `override`, else the task's solver, else the bundle's."""
        name = override or task.solver or self.solver
        if name is None:
            raise BundleError(
                f"{self.path}: task {task.id!r} names no solver and the bundle sets no default; add "
                '`solver = "AGENT"` to the task or at the top of the file, or pass agent= to AgentWorkflow'
            )
        return self._agent(name, f"the solver of task {task.id!r}")

    def helper_agents(self, task: Task) -> Iterator[tuple[Helper, Agent]]:
        """The task's other agents, each with its definition."""
        for helper in task.helpers:
            yield helper, self._agent(helper.agent, f"a helper of task {task.id!r}")

    def _agent(self, name: str, role: str) -> Agent:
        agent = self.agents.get(name)
        if agent is None:
            raise BundleError(f"{self.path}: {role} is {name!r}, which is not one of {_listed(self.agents)}")
        return agent


def load_bundle(path: str | os.PathLike[str]) -> Bundle:
    """Read and validate the bundle at `path`. Relative mount sources resolve against its directory.

    Raises BundleError (a ValueError) naming the file, the entry and the fix.
    """
    path = Path(path).resolve()
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise BundleError(f"{path}: cannot read the bundle ({exc.strerror}); check the bundle= path") from exc
    except tomllib.TOMLDecodeError as exc:
        raise BundleError(f"{path}: not valid TOML ({exc}); fix the syntax at that line") from exc
    top = _Entry(path, "", doc)
    top.only("solver", "timeout_s", "agents", "judges", "tasks")
    default_timeout_s = top.number("timeout_s", DEFAULT_TIMEOUT_S)
    agents = {name: _agent(entry) for name, entry in top.tables("agents", "agents")}
    judges = {name: _judge(entry) for name, entry in top.tables("judges", "judges")}
    tasks: dict[str, Task] = {}
    for entry in top.array("tasks"):
        task = _task(entry, default_timeout_s)
        if task.id in tasks:
            raise entry.error(f"repeats the id {task.id!r}; give every task its own id")
        tasks[task.id] = task
    if not tasks:
        raise top.error("has no [[tasks]]; add at least one task")
    bundle = Bundle(path, agents, judges, tasks, top.opt_text("solver"))
    _check_references(bundle)
    return bundle


def _agent(entry: _Entry) -> Agent:
    entry.only("command", "image", "workdir", "answer", "env", "mounts", "endpoint")
    mounts = tuple(
        _mount(entry.path, name, sub) for name, sub in entry.tables("mounts", f"agents.{entry.key}.mounts")
    )
    agent = Agent(
        name=entry.key,
        command=entry.texts("command", required=True),
        image=entry.opt_text("image"),
        workdir=entry.text("workdir", DEFAULT_WORKDIR),
        answer=_answer(entry),
        env=entry.text_table("env"),
        mounts=mounts,
        endpoint=_endpoint(entry),
    )
    allowed = TEMPLATE_VARIABLES | {f"mount_{mount.name}" for mount in mounts}
    for text in (*agent.command, *agent.env.values()):
        entry.templated(text, allowed)
    return agent


def _mount(path: Path, name: str, entry: _Entry) -> Mount:
    entry.only("source", "target", "read_only")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise entry.error("is not usable as ${mount_NAME}; use letters, digits and underscores only")
    target = entry.text("target")
    if not target.startswith("/"):
        raise entry.error(f"has target {target!r}; a mount target is an absolute path in the sandbox")
    source = Path(entry.text("source")).expanduser()
    return Mount(name, (path.parent / source).resolve(), target, entry.flag("read_only", True))


def _answer(entry: _Entry) -> Answer:
    raw = entry.raw.get("answer", "stdout")
    if isinstance(raw, str) and raw in ANSWER_KINDS:
        return Answer(raw)
    if isinstance(raw, dict) and set(raw) == {"file"} and isinstance(raw["file"], str) and raw["file"]:
        if path_inside(raw["file"]) is None:
            raise entry.error(
                f"has answer = {{file = {raw['file']!r}}}; the answer file is a path inside the agent's "
                'workdir: relative, without "..", e.g. {file = "answer.txt"}'
            )
        return Answer("file", raw["file"])
    raise entry.error(f'has answer = {raw!r}; use one of {", ".join(ANSWER_KINDS)} or {{file = "PATH"}}')


def _endpoint(entry: _Entry) -> Endpoint:
    sub = entry.sub("endpoint")
    sub.only("base_url_vars", "api_key_vars", "suffix", "base_url", "api_key", "api_key_from_env", "model")
    return Endpoint(
        base_url_vars=sub.texts("base_url_vars"),
        api_key_vars=sub.texts("api_key_vars"),
        suffix=sub.text("suffix", ""),
        base_url=sub.opt_text("base_url"),
        api_key=_api_key(sub),
        model=sub.opt_text("model"),
    )


def _judge(entry: _Entry) -> Judge:
    entry.only("base_url", "model", "api_key", "api_key_from_env", "api")
    api = cast(Literal["openai", "anthropic"], entry.choice("api", ("openai", "anthropic")))
    return Judge(entry.key, entry.text("base_url"), entry.text("model"), _api_key(entry), api)


def _api_key(entry: _Entry) -> str | None:
    """The key written in the file, or read from the variable it names, which must then be set."""
    variable = entry.opt_text("api_key_from_env")
    if variable is None:
        return entry.opt_text("api_key")
    if "api_key" in entry.raw:
        raise entry.error("has both api_key and api_key_from_env; keep one")
    key = os.environ.get(variable)
    if not key:
        raise entry.error(f"reads its key from ${variable}, which is not set; export it before training")
    return key


def _task(entry: _Entry, default_timeout_s: float) -> Task:
    task_id = entry.text("id")
    entry.name = f"{entry.name} (id {task_id!r})"
    entry.only("id", "prompt", "solver", "timeout_s", "train", "score", "agents", "checks")
    score = cast(Literal["mean", "all"], entry.choice("score", ("mean", "all")))
    checks = tuple(_check(sub) for sub in entry.array("checks"))
    if not checks:
        raise entry.error("has no checks, so its runs could never be scored; add at least one check")
    helpers = tuple(_helper(sub) for sub in entry.array("agents"))
    return Task(
        id=task_id,
        prompt=entry.text("prompt"),
        checks=checks,
        solver=entry.opt_text("solver"),
        timeout_s=entry.number("timeout_s", default_timeout_s),
        train=entry.flag("train", True),
        score=score,
        helpers=helpers,
    )


def _check(entry: _Entry) -> Check:
    entry.only(*CHECK_KINDS, "weight", "rubric")
    kinds = [kind for kind in CHECK_KINDS if kind in entry.raw]
    if len(kinds) != 1:
        raise entry.error(f"must have exactly one of {', '.join(CHECK_KINDS)} (it has {kinds or 'none'})")
    kind = kinds[0]
    weight = entry.number("weight", 1.0)
    if "rubric" in entry.raw and kind != "judge":
        raise entry.error('has a rubric, which only a judge check reads; drop it or use judge = "NAME"')
    if kind == "judge":
        return Check(kind, entry.text("rubric"), weight, judge=entry.text("judge"))
    if kind == "command":
        raw = entry.raw["command"]
        command = ("sh", "-c", raw) if isinstance(raw, str) else entry.texts("command", required=True)
        return Check(kind, command, weight)
    expected = entry.text(kind)
    if kind == "regex":
        try:
            re.compile(expected)
        except re.error as exc:
            raise entry.error(f"has a regex that does not compile ({exc}); fix the pattern") from exc
    return Check(kind, expected, weight)


def _helper(entry: _Entry) -> Helper:
    entry.only("agent", "prompt", "stage")
    stage = cast(Literal["before", "after"], entry.choice("stage", ("after", "before")))
    prompt = entry.text("prompt")
    entry.templated(prompt, TEMPLATE_VARIABLES)
    return Helper(entry.text("agent"), prompt, stage)


def _check_references(bundle: Bundle) -> None:
    """Every name a task uses exists, and every helper can reach its own model."""
    for task in bundle.tasks.values():
        if task.solver is not None:
            bundle.solver_for(task)
        for _, agent in bundle.helper_agents(task):
            if agent.endpoint.base_url is None:
                raise BundleError(
                    f"{bundle.path}: agent {agent.name!r} runs as a helper of task {task.id!r} but has no "
                    "endpoint.base_url; only the solver's traffic goes through the proxy, so give it its own"
                )
        for check in task.checks:
            if check.judge is not None and check.judge not in bundle.judges:
                raise BundleError(
                    f"{bundle.path}: task {task.id!r} has a judge check naming {check.judge!r}, which is not "
                    f"one of {_listed(bundle.judges)}; add [judges.{check.judge}] or fix the name"
                )
    if bundle.solver is not None and bundle.solver not in bundle.agents:
        raise BundleError(f"{bundle.path}: solver = {bundle.solver!r} is not one of {_listed(bundle.agents)}")


def _listed(names: Mapping[str, object]) -> str:
    return ", ".join(repr(name) for name in names) or "none"


class _Entry:
    """One table of the file, with typed getters whose errors say where the value was and what to do."""

    def __init__(self, path: Path, name: str, raw: Mapping[str, Any], key: str = "") -> None:
        self.path, self.name, self.raw, self.key = path, name, raw, key

    def error(self, problem: str) -> BundleError:
        return BundleError(f"{self.path}: {self.name or 'the file'} {problem}")

    def only(self, *allowed: str) -> None:
        unknown = sorted(set(self.raw) - set(allowed))
        if unknown:
            raise self.error(f"has unknown key(s) {', '.join(unknown)}; allowed here: {', '.join(allowed)}")

    def _get(self, key: str, kind: type | tuple[type, ...], what: str, default: Any) -> Any:
        value = self.raw.get(key, default)
        if value is _REQUIRED:
            raise self.error(f"has no {key}; add {key} = <{what}>")
        # TOML booleans are Python bools, which are also ints: a number must not accept `true`.
        if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
            raise self.error(f"has {key} = {value!r}; it must be {what}")
        return value

    def text(self, key: str, default: Any = None) -> str:
        value: str = self._get(key, str, "a string", _REQUIRED if default is None else default)
        if not value and default is None:
            raise self.error(f"has an empty {key}; give it a value")
        return value

    def choice(self, key: str, options: tuple[str, ...]) -> str:
        """One of `options`; the first is the default."""
        value = self.text(key, options[0])
        if value not in options:
            raise self.error(f"has {key} = {value!r}; use one of {', '.join(map(repr, options))}")
        return value

    def opt_text(self, key: str) -> str | None:
        return self.text(key) if key in self.raw else None

    def number(self, key: str, default: float) -> float:
        value = float(self._get(key, (int, float), "a number", default))
        if value <= 0:
            raise self.error(f"has {key} = {value}; it must be positive")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value: bool = self._get(key, bool, "true or false", default)
        return value

    def texts(self, key: str, required: bool = False) -> tuple[str, ...]:
        value = self._get(key, list, "a list of strings", _REQUIRED if required else [])
        if not all(isinstance(item, str) for item in value) or (required and not value):
            raise self.error(f"has {key} = {value!r}; it must be a non-empty list of strings")
        return tuple(value)

    def text_table(self, key: str) -> dict[str, str]:
        value = self._get(key, dict, "a table of strings", {})
        bad = [name for name, item in value.items() if not isinstance(item, str)]
        if bad:
            raise self.error(f"has non-string {key} value(s) for {', '.join(bad)}; quote them")
        return dict(value)

    def sub(self, key: str) -> _Entry:
        return _Entry(self.path, f"{self.name}.{key}", self._get(key, dict, "a table", {}), key)

    def tables(self, key: str, name: str) -> Iterator[tuple[str, _Entry]]:
        for sub_key, value in self._get(key, dict, "a table", {}).items():
            if not isinstance(value, dict):
                raise self.error(f"has {key}.{sub_key} = {value!r}; it must be a table ([{name}.{sub_key}])")
            yield sub_key, _Entry(self.path, f"[{name}.{sub_key}]", value, sub_key)

    def array(self, key: str) -> Iterator[_Entry]:
        for index, value in enumerate(self._get(key, list, "an array of tables", [])):
            if not isinstance(value, dict):
                raise self.error(f"has {key}[{index}] = {value!r}; it must be a table")
            name = f"{self.name}.{key}[{index}]" if self.name else f"{key}[{index}]"
            yield _Entry(self.path, name, value, str(index))

    def templated(self, text: str, allowed: frozenset[str] | set[str]) -> None:
        template = Template(text)
        if not template.is_valid():
            raise self.error(f"has a malformed ${{…}} in {text!r}; write $${{ for a literal ${{")
        unknown = sorted(set(template.get_identifiers()) - allowed)
        if unknown:
            raise self.error(
                f"uses unknown template variable(s) {unknown}; available: {sorted(allowed)} "
                "(write $${ for a literal ${)"
            )


_REQUIRED: Any = object()
