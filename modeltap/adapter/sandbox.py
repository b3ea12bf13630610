"""Where an agent's commands run: a Docker container per run, or a process group on the host.

Owns: the Sandbox protocol and its two implementations, the labels every container carries, the reaper
that removes containers a dead process left behind, and the only place docker SDK errors are caught
(they become SandboxError). Does not own: what runs in a sandbox or how it is scored (runner.py).

    provider = DockerProvider()                      # or LocalProvider()
    await provider.prepare(["modeltap-agent:local"])  # once per process: images exist, strays reaped
    async with await provider.open(spec) as sandbox:  # a container labelled modeltap.run=<run id>
        result = await sandbox.exec(["sh", "-c", "echo hi"], env={}, timeout_s=10)
    await provider.close()                            # removes every container this process still owns

Every docker call runs in its own daemon thread and hands its result back through the loop's
thread-safe call: a command can block its call for the whole run, so a shared thread pool would let
long commands starve the short calls (container removal) that tear runs down, and non-daemon pool
threads would hold interpreter exit until they return.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import socket
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Protocol, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions

from modeltap.adapter.bundle import Mount
from modeltap.proxy.tasks import finish

T = TypeVar("T")

LABEL_RUN = "modeltap.run"
LABEL_OWNER = "modeltap.owner"
# The container's main process only keeps it alive; commands run as execs beside it, so files the
# solver leaves behind are still there when the checks run. No `init`: Docker mounts its init at
# /sbin/docker-init, which fails in images whose /sbin is a link into a read-only /usr (the test
# image), and the zombies it would reap live only as long as the run's container.
KEEPALIVE_COMMAND = ("sleep", "infinity")
# Every container is new, so root's home in it is a run's own.
CONTAINER_HOME = "/root"
# Control calls (create, inspect, remove) answer in well under a second on a healthy daemon; a minute
# means the daemon is stuck, and a teardown must not wait for it forever.
DOCKER_API_TIMEOUT_S = 60.0
# One connection per concurrent call: many runs stream exec output at once, and docker-py's default
# pool of 10 would otherwise open and discard a connection on every extra call.
DOCKER_POOL_SIZE = 64
# Answers and files read back from a sandbox are text the checks compare; anything larger is not an
# answer but a runaway log.
MAX_FILE_BYTES = 8 * 1024 * 1024
# What one command's output keeps in the run's log (its tail: the end is where errors are).
MAX_LOG_CHARS_PER_STREAM = 4000


class SandboxError(Exception):
    """The sandbox itself failed: no such image, the daemon refused, a container vanished."""


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """What a run's sandbox needs: its run id (the container label), image, working directory, mounts."""

    run_id: str
    image: str | None
    workdir: str
    mounts: tuple[Mount, ...] = ()


@dataclass(frozen=True, slots=True)
class ExecResult:
    """One command's outcome. `exit_code` is None when the command was stopped at its timeout."""

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float

    @property
    def timed_out(self) -> bool:
        return self.exit_code is None

    def log_entry(self) -> str:
        """A readable log paragraph: the command, how it ended, and the tail of each stream."""
        ended = "timed out" if self.timed_out else f"exit {self.exit_code}"
        lines = [f"$ {' '.join(self.argv)[:400]}  ({ended}, {self.duration_s:.1f} s)"]
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                lines.append(f"--- {name} ---\n{text[-MAX_LOG_CHARS_PER_STREAM:].rstrip()}")
        return "\n".join(lines)


class Sandbox(Protocol):
    """One run's isolated place to execute commands; closing it removes everything it created.

    `endpoint_kind` says which base URL of the proxy its processes can reach ("container" or "host");
    `home` is a directory of the run's own, for agents' HOME (never the real one).
    """

    endpoint_kind: Literal["container", "host"]
    workdir: str
    home: str
    logs: list[str]

    def mount_path(self, mount: Mount) -> str: ...

    async def exec(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ExecResult: ...

    async def read_file(self, path: str) -> bytes | None: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc: object) -> None: ...


class SandboxProvider(Protocol):
    """Makes sandboxes of one kind; one per process, shared by every run."""

    async def prepare(self, images: Iterable[str]) -> None: ...

    async def open(self, spec: SandboxSpec) -> Sandbox: ...

    async def close(self) -> None: ...


class _Closing:
    """`async with` support: close on exit, whatever happened inside."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _in_thread(name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Run `fn` in a new daemon thread; the returned future resolves on the calling loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the awaiting side timed out or was cancelled
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def target() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(*args, **kwargs), None)
        except BaseException as exc:  # delivered to the awaiting coroutine, which decides
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed while the call ran: nobody is waiting any more
            pass

    threading.Thread(target=target, name=f"modeltap-{name}", daemon=True).start()
    return future


def _owner_id() -> str:
    """This process, as a label value: host, pid and the pid's start time (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, starttime, counted after the comm field


def _owner_alive(owner: str) -> bool:
    host, _, rest = owner.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another machine's process: not ours to judge
    return _start_ticks(int(pid)) == ticks


class DockerProvider(_Closing):
    """Docker sandboxes on the local daemon, reached through the docker SDK.

    Containers join the default bridge, so the solver reaches the proxy at the bridge gateway (the
    proxy's `container_base_url`); `host.docker.internal` is mapped to the same address for agents
    configured with that name.
    """

    def __init__(self) -> None:
        self.owner = _owner_id()
        self._client: docker.DockerClient | None = None
        self._streams: docker.DockerClient | None = None
        self._prepared: set[str] = set()
        self._reaped = False

    async def _clients(self) -> tuple[docker.DockerClient, docker.DockerClient]:
        if self._client is None or self._streams is None:
            # Through locals: with the Optional attributes as targets, mypy takes the call's type from
            # them and cannot narrow them.
            client, streams = await _in_thread("docker-connect", _connect)
            self._client, self._streams = client, streams
        return self._client, self._streams

    async def prepare(self, images: Iterable[str]) -> None:
        """Check every image exists (pulling it if not), and reap strays once per process."""
        client, _ = await self._clients()
        if not self._reaped:
            await self.reap_strays()
            self._reaped = True
        for image in sorted(set(images) - self._prepared):
            await _in_thread("docker-image", _ensure_image, client, image)
            self._prepared.add(image)

    async def open(self, spec: SandboxSpec) -> DockerSandbox:
        """Create and start the run's container."""
        if spec.image is None:
            raise SandboxError(
                f'run {spec.run_id}: the agent has no image; set `image = "…"` for it in the bundle '
                'or use runner="local"'
            )
        client, streams = await self._clients()
        labels = {LABEL_RUN: spec.run_id, LABEL_OWNER: self.owner}
        try:
            container = await finish(_in_thread("docker-create", _create, client, spec, labels))
        except asyncio.CancelledError:
            await self.remove_run(spec.run_id)  # cancelled while creating: the new container is a stray
            raise
        return DockerSandbox(client, streams, container, spec)

    async def remove_run(self, run_id: str) -> None:
        """Remove every container of one run, whatever state it is in."""
        client, _ = await self._clients()
        found = await finish(_in_thread("docker-list", _list, client, {"label": f"{LABEL_RUN}={run_id}"}))
        for container in found:
            await finish(_in_thread("docker-remove", _remove, container))

    async def containers(self, run_id: str | None = None) -> list[str]:
        """Ids of the containers labelled by modeltap (of one run, if given), running or not."""
        client, _ = await self._clients()
        label = f"{LABEL_RUN}={run_id}" if run_id else LABEL_OWNER
        found = await _in_thread("docker-list", _list, client, {"label": label})
        return [container.id for container in found]

    async def reap_strays(self) -> int:
        """Remove containers whose owning process on this host is gone. Returns how many."""
        client, _ = await self._clients()
        found = await _in_thread("docker-list", _list, client, {"label": LABEL_OWNER})
        strays = [c for c in found if not _owner_alive(c.labels.get(LABEL_OWNER, ""))]
        for container in strays:
            await finish(_in_thread("docker-remove", _remove, container))
        return len(strays)

    async def close(self) -> None:
        """Remove every container this process still owns and drop the daemon connections."""
        if self._client is None or self._streams is None:
            return
        found = await _in_thread("docker-list", _list, self._client, {"label": f"{LABEL_OWNER}={self.owner}"})
        for container in found:
            await finish(_in_thread("docker-remove", _remove, container))
        self._client.close()
        self._streams.close()
        self._client = self._streams = None


class DockerSandbox(_Closing):
    """One run's container; commands run in it as execs."""

    endpoint_kind: Literal["container", "host"] = "container"

    def __init__(self, client: Any, streams: Any, container: Any, spec: SandboxSpec) -> None:
        self._client, self._streams, self._container = client, streams, container
        self.workdir = spec.workdir
        self.home = CONTAINER_HOME
        self.run_id = spec.run_id
        self.logs: list[str] = []
        self._closed = False

    def mount_path(self, mount: Mount) -> str:
        return mount.target

    async def exec(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ExecResult:
        """Run `argv` in the container. At the timeout the command is abandoned (the run then fails and
        its container is removed, which ends it)."""
        started = time.monotonic()
        call = _in_thread("docker-exec", _exec, self._streams, self._container.id, argv, env, self.workdir)
        try:
            exit_code, stdout, stderr = await asyncio.wait_for(call, timeout_s)
        except TimeoutError:
            exit_code, stdout, stderr = None, "", ""
        result = ExecResult(tuple(argv), exit_code, stdout, stderr, time.monotonic() - started)
        self.logs.append(result.log_entry())
        return result

    async def read_file(self, path: str) -> bytes | None:
        """The file at `path` (relative to the workdir), or None if it does not exist."""
        full = str(PurePosixPath(self.workdir, path))
        return await _in_thread("docker-read", _read_file, self._container, full)

    async def close(self) -> None:
        """Keep the container's own output in the log, then remove it (force: it is still running)."""
        if self._closed:
            return
        self._closed = True
        container_logs = await finish(_in_thread("docker-logs", _container_logs, self._container))
        if container_logs:
            self.logs.append(f"--- container output ---\n{container_logs}")
        await finish(_in_thread("docker-remove", _remove, self._container))


# The blocking halves of the calls above. Each runs in its own thread; docker SDK errors stop here.


def _connect() -> tuple[docker.DockerClient, docker.DockerClient]:
    try:
        control = docker.from_env(timeout=int(DOCKER_API_TIMEOUT_S), max_pool_size=DOCKER_POOL_SIZE)
        control.ping()
        # Exec output arrives whenever the command writes; silence is not a fault, so this client
        # has no read timeout (the run's own timeout bounds it).
        # types-docker declares timeout an int, but docker hands it to requests, where None is no timeout.
        streams = docker.from_env(timeout=None, max_pool_size=DOCKER_POOL_SIZE)  # type: ignore[arg-type]
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxError(
            f"cannot reach the Docker daemon ({exc}); start dockerd (or set DOCKER_HOST), "
            'or use runner="local"'
        ) from exc
    return control, streams


def _ensure_image(client: docker.DockerClient, image: str) -> None:
    try:
        client.images.get(image)
        return
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise SandboxError(f"cannot inspect image {image!r}: {exc}") from exc
    try:
        client.images.pull(image)
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"image {image!r} is not present and could not be pulled ({exc}); build or load it on this "
            "machine first (for the test image: make docker-image)"
        ) from exc


def _create(client: docker.DockerClient, spec: SandboxSpec, labels: dict[str, str]) -> Any:
    assert spec.image is not None, "DockerProvider.open refuses a spec without an image"
    mounts = [
        docker.types.Mount(m.target, str(m.source), type="bind", read_only=m.read_only) for m in spec.mounts
    ]
    try:
        container = client.containers.create(
            spec.image,
            command=list(KEEPALIVE_COMMAND),
            labels=labels,
            mounts=mounts,
            working_dir=spec.workdir,
            extra_hosts={"host.docker.internal": "host-gateway"},
            detach=True,
        )
    except docker.errors.DockerException as exc:
        raise SandboxError(
            f"run {spec.run_id}: cannot create a container from {spec.image!r}: {exc}"
        ) from exc
    try:
        container.start()
    except docker.errors.DockerException as exc:
        _remove(container)
        raise SandboxError(f"run {spec.run_id}: container from {spec.image!r} did not start: {exc}") from exc
    return container


def _exec(
    client: docker.DockerClient, container_id: str, argv: Sequence[str], env: Mapping[str, str], workdir: str
) -> tuple[int, str, str]:
    try:
        created = client.api.exec_create(container_id, list(argv), environment=dict(env), workdir=workdir)
        stdout, stderr = client.api.exec_start(created["Id"], demux=True)
        exit_code = client.api.exec_inspect(created["Id"])["ExitCode"]
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxError(f"command {list(argv)[:3]}… could not run in the container: {exc}") from exc
    return exit_code, _text(stdout), _text(stderr)


def _read_file(container: Any, path: str) -> bytes | None:
    try:
        chunks, stat = container.get_archive(path)
    except docker.errors.NotFound:
        return None
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot read {path} from the container: {exc}") from exc
    if stat["size"] > MAX_FILE_BYTES:
        raise SandboxError(
            f"{path} is {stat['size']} bytes, over the {MAX_FILE_BYTES}-byte limit for answers"
        )
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
        member = archive.next()
        extracted = archive.extractfile(member) if member is not None else None
        return extracted.read() if extracted is not None else None


def _container_logs(container: Any) -> str:
    try:
        return _text(container.logs(tail=200))
    except docker.errors.DockerException as exc:
        return f"(container output unavailable: {exc})"


def _remove(container: Any) -> None:
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass  # already gone: what removal wants
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: removal already in progress
            raise SandboxError(f"cannot remove container {container.id[:12]}: {exc}") from exc


def _list(client: docker.DockerClient, filters: dict[str, str | list[str] | bool]) -> list[Any]:
    try:
        found: list[Any] = client.containers.list(all=True, filters=filters)
    except docker.errors.DockerException as exc:
        raise SandboxError(f"cannot list containers: {exc}") from exc
    return found


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", errors="replace")


class LocalProvider(_Closing):
    """Sandboxes that are host processes in a temporary directory, for machines without Docker.

    There is no isolation: an agent can read and write anything the training process can. Mounts are
    used in place (`${mount_NAME}` is the source path) and images are ignored.
    """

    async def prepare(self, images: Iterable[str]) -> None:
        """Nothing to prepare on the host."""

    async def open(self, spec: SandboxSpec) -> LocalSandbox:
        """Make the run's directory: `work/` (the workdir) and `home/` (its HOME)."""
        root = await _in_thread("local-mkdir", _make_root, spec.run_id)
        return LocalSandbox(root, spec)

    async def close(self) -> None:
        """Local sandboxes own their processes; nothing is left at provider level."""


class LocalSandbox(_Closing):
    """A run's temporary directory on the host; each command is its own process group."""

    endpoint_kind: Literal["container", "host"] = "host"

    def __init__(self, root: Path, spec: SandboxSpec) -> None:
        self._root = root
        self.workdir = str(root / "work")
        self.home = str(root / "home")
        self.run_id = spec.run_id
        self.logs: list[str] = []
        self._groups: set[int] = set()

    def mount_path(self, mount: Mount) -> str:
        return str(mount.source)

    async def exec(self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> ExecResult:
        """Run `argv` in its own session (so its whole process group can be killed) under the workdir."""
        started = time.monotonic()
        base = {
            "PATH": os.environ.get("PATH", os.defpath),
            "HOME": self.home,
            "LANG": "C.UTF-8",
        }
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.workdir,
                env={**base, **env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(
                f"cannot start {argv[0]!r}: {exc.strerror}; check the agent's command"
            ) from exc
        self._groups.add(process.pid)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
            exit_code: int | None = process.returncode
        except TimeoutError:
            _kill_group(process.pid)
            await process.wait()
            exit_code, stdout, stderr = None, b"", b""
        except BaseException:
            _kill_group(process.pid)
            await process.wait()
            raise
        result = ExecResult(tuple(argv), exit_code, _text(stdout), _text(stderr), time.monotonic() - started)
        self.logs.append(result.log_entry())
        return result

    async def read_file(self, path: str) -> bytes | None:
        """The file at `path` (relative to the workdir), or None if it does not exist."""
        return await _in_thread("local-read", _read_host_file, Path(self.workdir, path))

    async def close(self) -> None:
        """Kill every process group the run started (stray background children too), then delete the
        directory."""
        for group in self._groups:
            _kill_group(group)
        self._groups.clear()
        await finish(_in_thread("local-rmtree", shutil.rmtree, self._root, True))


def _make_root(run_id: str) -> Path:
    root = Path(tempfile.mkdtemp(prefix=f"modeltap-{run_id}-"))
    (root / "work").mkdir()
    (root / "home").mkdir()
    return root


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has already exited


def _read_host_file(path: Path) -> bytes | None:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError):
        return None
    if len(data) > MAX_FILE_BYTES:
        raise SandboxError(f"{path} is over the {MAX_FILE_BYTES}-byte limit for answers")
    return data


def provider_for(runner: str) -> SandboxProvider:
    """The provider for AgentWorkflow's `runner=` argument: "docker" or "local"."""
    if runner == "docker":
        return DockerProvider()
    if runner == "local":
        return LocalProvider()
    raise ValueError(f'runner={runner!r} is not a sandbox kind; use runner="docker" or runner="local"')
