"""Docker sandboxes: a container per run on the local daemon, reached through the docker SDK (the
`[adapter]` extra).

Owns: the labels every container carries, the reaper that removes containers a dead process left
behind, and the only place docker SDK errors are caught (they become SandboxError). Does not own the
Sandbox protocol (sandbox.py).

    provider = DockerProvider()
    await provider.prepare(["modeltap-agent:local"])  # once per process: images exist, strays reaped
    async with await provider.open(spec) as sandbox:  # a container labelled modeltap.run=<run id>
        result = await sandbox.exec(["sh", "-c", "echo hi"], env={}, timeout_s=10)
    await provider.close()                            # removes every container this process still owns
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import docker
import docker.errors
import docker.types
import requests.exceptions

from modeltap.adapter.bundle import Mount, path_inside
from modeltap.adapter.sandbox import (
    MAX_FILE_BYTES,
    BoundedOutput,
    Closing,
    ExecResult,
    SandboxError,
    SandboxSpec,
    decoded,
    in_thread,
    unwinding,
)
from modeltap.proxy.tasks import finish

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
# Where dockerd answers a path's stat (base64 JSON: name, size, mode, mtime, linkTarget).
PATH_STAT_HEADER = "X-Docker-Container-Path-Stat"
# The type bits of the stat's `mode`, a Go fs.FileMode: directory, symlink, named pipe, socket, device,
# char device, irregular (https://pkg.go.dev/io/fs#FileMode). A regular file has none of them.
GO_MODE_TYPE = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)
# What a one-file tar archive adds to the file: its header (a PAX header too for a long name), the
# padding to 512 bytes and the two zero blocks that end it.
TAR_FRAMING_BYTES = 64 * 1024
ARCHIVE_CHUNK_BYTES = 64 * 1024


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


class DockerProvider(Closing):
    """Docker sandboxes on the local daemon, reached through the docker SDK.

    Containers join the default bridge, so the solver reaches the proxy at the bridge gateway (the
    proxy's `container_base_url`); `host.docker.internal` is mapped to the same address for agents
    configured with that name.
    """

    def __init__(self) -> None:
        self.owner = _owner_id()
        # One connection attempt shared by every caller: concurrent first runs would otherwise each
        # connect, and a caller cancelled mid-connect would drop clients nobody then closes.
        self._connecting: asyncio.Future[tuple[docker.DockerClient, docker.DockerClient]] | None = None
        self._prepared: set[str] = set()
        self._reaped = False

    async def _clients(self) -> tuple[docker.DockerClient, docker.DockerClient]:
        if self._connecting is None:
            self._connecting = in_thread("docker-connect", _connect)
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        except SandboxError:
            if self._connecting is connecting:
                self._connecting = None  # the next call tries again
            raise

    async def prepare(self, images: Iterable[str]) -> None:
        """Check every image exists (pulling it if not), and reap strays once per process."""
        client, _ = await self._clients()
        if not self._reaped:
            await self.reap_strays()
            self._reaped = True
        for image in sorted(set(images) - self._prepared):
            await in_thread("docker-image", _ensure_image, client, image)
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
            container = await finish(in_thread("docker-create", _create, client, spec, labels))
        except asyncio.CancelledError:
            # Cancelled while creating: the new container is a stray. Removed to the end, however often
            # the cancel is repeated meanwhile.
            await unwinding(self.remove_run(spec.run_id))
            raise
        return DockerSandbox(client, streams, container, spec)

    async def remove_run(self, run_id: str) -> None:
        """Remove every container of one run, whatever state it is in."""
        client, _ = await self._clients()
        found = await finish(in_thread("docker-list", _list, client, {"label": f"{LABEL_RUN}={run_id}"}))
        for container in found:
            await finish(in_thread("docker-remove", _remove, container))

    async def containers(self, run_id: str | None = None) -> list[str]:
        """Ids of the containers labelled by modeltap (of one run, if given), running or not."""
        client, _ = await self._clients()
        label = f"{LABEL_RUN}={run_id}" if run_id else LABEL_OWNER
        found = await in_thread("docker-list", _list, client, {"label": label})
        return [container.id for container in found]

    async def reap_strays(self) -> int:
        """Remove containers whose owning process on this host is gone. Returns how many."""
        client, _ = await self._clients()
        found = await in_thread("docker-list", _list, client, {"label": LABEL_OWNER})
        strays = [c for c in found if not _owner_alive(c.labels.get(LABEL_OWNER, ""))]
        for container in strays:
            await finish(in_thread("docker-remove", _remove, container))
        return len(strays)

    async def close(self) -> None:
        """Remove every container this process still owns and drop the daemon connections."""
        connecting, self._connecting = self._connecting, None
        if connecting is None:
            return
        try:
            client, streams = await finish(connecting)
        except SandboxError:
            return  # never connected: nothing was made
        try:
            found = await in_thread("docker-list", _list, client, {"label": f"{LABEL_OWNER}={self.owner}"})
            for container in found:
                await finish(in_thread("docker-remove", _remove, container))
        finally:
            client.close()
            streams.close()


class DockerSandbox(Closing):
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
        call = in_thread("docker-exec", _exec, self._streams, self._container.id, argv, env, self.workdir)
        try:
            # asyncio.timeout, not 3.11's wait_for: that one returns the result and drops a cancel that
            # arrives as the call completes, and the cancelled run would then carry on.
            async with asyncio.timeout(timeout_s):
                exit_code, stdout, stderr = await call
        except TimeoutError:
            exit_code, stdout, stderr = None, "", ""
        result = ExecResult(tuple(argv), exit_code, stdout, stderr, time.monotonic() - started)
        self.logs.append(result.log_entry())
        return result

    async def read_file(self, path: str) -> bytes | None:
        """The regular file at `path` inside the workdir, or None if there is none. A path that
        leaves the workdir, or names a link, a directory, a FIFO or a device, is a SandboxError.
        (dockerd resolves links on the way within the container's root, docs/docker.md §1.)"""
        parts = path_inside(path)
        if parts is None:
            raise SandboxError(f"answer file {path!r} is not a path inside the workdir")
        full = str(PurePosixPath(self.workdir, *parts))
        return await in_thread("docker-read", _read_file, self._container, full)

    async def close(self) -> None:
        """Keep the container's own output in the log, then remove it (force: it is still running)."""
        if self._closed:
            return
        self._closed = True
        await unwinding(self._remove())  # a cancel between its steps must not skip the removal

    async def _remove(self) -> None:
        container_logs = await in_thread("docker-logs", _container_logs, self._container)
        if container_logs:
            self.logs.append(f"--- container output ---\n{container_logs}")
        await in_thread("docker-remove", _remove, self._container)


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
    """Run one exec to its end, its output kept within BoundedOutput's bound (docs/docker.md §2)."""
    streams = {"stdout": BoundedOutput(), "stderr": BoundedOutput()}
    try:
        created = client.api.exec_create(container_id, list(argv), environment=dict(env), workdir=workdir)
        frames = client.api.exec_start(created["Id"], stream=True, demux=True)
        try:
            for stdout, stderr in frames:
                if stdout:
                    streams["stdout"].write(stdout)
                if stderr:
                    streams["stderr"].write(stderr)
        finally:
            frames.close()
        exit_code = client.api.exec_inspect(created["Id"])["ExitCode"]
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise SandboxError(f"command {list(argv)[:3]}… could not run in the container: {exc}") from exc
    return exit_code, streams["stdout"].text(), streams["stderr"].text()


def _read_file(container: Any, path: str) -> bytes | None:
    stat = _path_stat(container, path)
    if stat is None:
        return None
    mode, size = int(stat["mode"]), int(stat["size"])
    if mode & GO_MODE_TYPE:
        raise SandboxError(f"{path} is not a regular file (Go file mode {mode:#x}: docs/docker.md §1)")
    if size > MAX_FILE_BYTES:
        raise SandboxError(f"{path} is {size} bytes, over the {MAX_FILE_BYTES}-byte limit for answers")
    archive = _archive(container, path)
    if archive is None:
        return None
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.next()
        if member is None or not member.isreg() or member.size > MAX_FILE_BYTES:
            raise SandboxError(f"{path} changed while it was read: it is no regular file within the limit")
        extracted = tar.extractfile(member)
        return extracted.read() if extracted is not None else None


def _archive(container: Any, path: str) -> bytes | None:
    """The tar archive of `path`, read within MAX_FILE_BYTES and the tar framing; None when it does
    not exist. Read from the Engine API directly, not Container.get_archive, so the stream is closed
    whatever happens (a stream left open holds the container: docs/docker.md §1), and a path that
    grew or became a directory since its stat was asked cannot make the read unbounded."""
    api, url = container.client.api, _archive_url(container)
    try:
        with api.get(url, params={"path": path}, stream=True, timeout=DOCKER_API_TIMEOUT_S) as answer:
            if answer.status_code == 404:
                return None
            if not answer.ok:
                raise _unreadable(path, answer.status_code)
            body = bytearray()
            for chunk in answer.iter_content(ARCHIVE_CHUNK_BYTES):
                body += chunk
                if len(body) > MAX_FILE_BYTES + TAR_FRAMING_BYTES:
                    raise SandboxError(f"{path} changed while it was read: over the limit for answers")
    except requests.exceptions.RequestException as exc:
        raise SandboxError(f"cannot read {path} from the container: {exc}") from exc
    return bytes(body)


def _path_stat(container: Any, path: str) -> dict[str, Any] | None:
    """The stat of `path` in the container (name, size, mode, mtime, linkTarget), None when it does
    not exist. Asked of the Engine API's HEAD on the archive route, which answers it in a header and
    streams nothing (docs/docker.md §1)."""
    api, url = container.client.api, _archive_url(container)
    try:
        answer = api.head(url, params={"path": path}, timeout=DOCKER_API_TIMEOUT_S)
    except requests.exceptions.RequestException as exc:
        raise SandboxError(f"cannot read {path} from the container: {exc}") from exc
    if answer.status_code == 404:
        return None
    stat = answer.headers.get(PATH_STAT_HEADER)
    if not answer.ok or stat is None:
        raise _unreadable(path, answer.status_code)
    decoded_stat: dict[str, Any] = json.loads(base64.b64decode(stat))
    return decoded_stat


def _archive_url(container: Any) -> str:
    api = container.client.api
    return f"{api.base_url}/v{api.api_version}/containers/{container.id}/archive"


def _unreadable(path: str, status: int) -> SandboxError:
    return SandboxError(f"cannot read {path} from the container: dockerd answered {status}")


def _container_logs(container: Any) -> str:
    try:
        return decoded(container.logs(tail=200))
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
