"""modeltap/adapter/sandbox.py against a real dockerd: labels, mounts, logs, timeouts, guaranteed
removal and the reaper."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest

from modeltap.adapter import docker_sandbox
from modeltap.adapter.bundle import Mount
from modeltap.adapter.docker_sandbox import LABEL_OWNER, LABEL_RUN, DockerProvider
from modeltap.adapter.sandbox import (
    MAX_FILE_BYTES,
    OUTPUT_HEAD_BYTES,
    OUTPUT_TAIL_BYTES,
    SandboxError,
    SandboxSpec,
)

USR = Mount("usr", Path("/usr"), "/usr")


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll `condition` until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"still not true after {timeout_s} s")


def run_containers(client: docker.DockerClient, run_id: str) -> list[str]:
    return [c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL_RUN}={run_id}"})]


async def test_a_container_is_labelled_runs_commands_with_mounts_and_is_removed_on_close(
    docker_client: docker.DockerClient, hostroot_image: str, tmp_path: Path
) -> None:
    (tmp_path / "input.txt").write_text("from the host\n")
    data = Mount("data", tmp_path, "/opt/data")
    provider = DockerProvider()
    await provider.prepare([hostroot_image])
    box = await provider.open(SandboxSpec("sbx-labels", hostroot_image, "/work", (USR, data)))
    try:
        (container,) = docker_client.containers.list(filters={"label": f"{LABEL_RUN}=sbx-labels"})
        assert container.labels[LABEL_OWNER] == provider.owner
        assert box.endpoint_kind == "container" and box.mount_path(data) == "/opt/data"
        result = await box.exec(
            [
                "bash",
                "-c",
                'pwd; cat /opt/data/input.txt; echo "$GREETING"; echo 42 > out.txt; echo bad >&2; exit 4',
            ],
            {"GREETING": "hello"},
            30,
        )
        assert (result.exit_code, result.stdout, result.stderr) == (
            4,
            "/work\nfrom the host\nhello\n",
            "bad\n",
        )
        assert await box.read_file("out.txt") == b"42\n"
        assert await box.read_file("missing.txt") is None
        read_only = await box.exec(["bash", "-c", "touch /opt/data/new"], {}, 30)
        assert read_only.exit_code != 0 and "Read-only file system" in read_only.stderr
    finally:
        await box.close()
    assert run_containers(docker_client, "sbx-labels") == []
    assert (
        "$ bash -c pwd" in box.logs[0] and "(exit 4," in box.logs[0] and "--- stderr ---\nbad" in box.logs[0]
    )
    await provider.close()


async def test_a_timed_out_command_is_abandoned_and_removal_still_ends_it(
    docker_client: docker.DockerClient, hostroot_image: str
) -> None:
    provider = DockerProvider()
    async with await provider.open(SandboxSpec("sbx-timeout", hostroot_image, "/work", (USR,))) as box:
        result = await box.exec(["sleep", "60"], {}, 0.5)
        assert result.timed_out
    assert run_containers(docker_client, "sbx-timeout") == []
    await provider.close()


async def test_cancelling_mid_command_removes_the_container_before_the_cancel_propagates(
    docker_client: docker.DockerClient, hostroot_image: str
) -> None:
    provider = DockerProvider()

    async def use() -> None:
        async with await provider.open(SandboxSpec("sbx-cancel", hostroot_image, "/work", (USR,))) as box:
            await box.exec(["sleep", "60"], {}, 120)

    task = asyncio.ensure_future(use())
    await until(lambda: bool(run_containers(docker_client, "sbx-cancel")))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert run_containers(docker_client, "sbx-cancel") == []
    await provider.close()


async def test_the_reaper_removes_containers_of_dead_processes_only(
    docker_client: docker.DockerClient, hostroot_image: str
) -> None:
    provider = DockerProvider()
    dead_owner = f"{socket.gethostname()}:999999999:0"  # no such pid
    elsewhere = "another-host:1:1"  # not this machine's to judge
    made = [
        docker_client.containers.create(
            hostroot_image, ["true"], labels={LABEL_RUN: "stray", LABEL_OWNER: dead_owner}
        ),
        docker_client.containers.create(
            hostroot_image, ["true"], labels={LABEL_RUN: "far", LABEL_OWNER: elsewhere}
        ),
    ]
    box = await provider.open(SandboxSpec("sbx-live", hostroot_image, "/work", (USR,)))
    try:
        assert await provider.reap_strays() >= 1  # other dead processes' strays may go too
        assert run_containers(docker_client, "stray") == []
        assert len(run_containers(docker_client, "far")) == 1
        assert len(run_containers(docker_client, "sbx-live")) == 1  # ours, and we are alive
    finally:
        await box.close()
        made[1].remove(force=True)
    await provider.close()


async def test_closing_the_provider_removes_every_container_this_process_still_owns(
    docker_client: docker.DockerClient, hostroot_image: str
) -> None:
    provider = DockerProvider()
    for index in range(2):
        await provider.open(SandboxSpec(f"sbx-leak-{index}", hostroot_image, "/work", (USR,)))  # never closed
    assert len(await provider.containers()) == 2
    await provider.close()
    assert run_containers(docker_client, "sbx-leak-0") == run_containers(docker_client, "sbx-leak-1") == []


async def test_a_missing_image_says_how_to_get_it() -> None:
    provider = DockerProvider()
    with pytest.raises(
        SandboxError, match=r"image 'modeltap-missing:none' is not present and could not be pulled"
    ):
        await provider.prepare(["modeltap-missing:none"])
    with pytest.raises(SandboxError, match="has no image"):
        await provider.open(SandboxSpec("sbx-noimage", None, "/work"))
    await provider.close()


async def test_failures_of_dockerd_are_sandbox_errors_naming_the_run_and_the_cause(
    docker_client: docker.DockerClient, hostroot_image: str, tmp_path: Path
) -> None:
    provider = DockerProvider()
    gone = Mount("gone", tmp_path / "not-there", "/opt/gone")
    with pytest.raises(SandboxError, match=r"run sbx-badmount: cannot create a container from"):
        await provider.open(SandboxSpec("sbx-badmount", hostroot_image, "/work", (USR, gone)))
    assert run_containers(docker_client, "sbx-badmount") == []
    async with await provider.open(SandboxSpec("sbx-bigfile", hostroot_image, "/work", (USR,))) as box:
        made = await box.exec(["bash", "-c", f"head -c {MAX_FILE_BYTES + 1} /dev/zero > big.bin"], {}, 30)
        assert made.exit_code == 0
        with pytest.raises(SandboxError, match=rf"big.bin is {MAX_FILE_BYTES + 1} bytes, over the"):
            await box.read_file("big.bin")
    await provider.remove_run("sbx-bigfile")  # after close: removing what is already gone is no error
    await provider.close()


async def test_a_command_s_huge_output_is_streamed_and_kept_bounded(
    docker_client: docker.DockerClient, hostroot_image: str
) -> None:
    """docker-py's exec_start without stream= joins 40 MB by bytes concatenation and holds it all."""
    provider = DockerProvider()
    size = 40 * 1024 * 1024
    async with await provider.open(SandboxSpec("sbx-bigout", hostroot_image, "/work", (USR,))) as box:
        script = f"head -c {size} /dev/zero | tr '\\0' x; echo END; echo oops >&2"
        result = await box.exec(["bash", "-c", script], {}, 120)
    assert (result.exit_code, result.stderr) == (0, "oops\n")
    dropped = size + 4 - OUTPUT_HEAD_BYTES - OUTPUT_TAIL_BYTES
    head, gap, tail = result.stdout.partition(f"\n[… {dropped} bytes of output dropped …]\n")
    assert gap and head == "x" * OUTPUT_HEAD_BYTES
    assert tail == "x" * (OUTPUT_TAIL_BYTES - 4) + "END\n"
    await provider.close()


async def read_or_hang(box: Any, path: str) -> bytes | SandboxError | None:
    reading = asyncio.ensure_future(box.read_file(path))
    done, _ = await asyncio.wait({reading}, timeout=30.0)  # a hang detector, not a speed limit
    assert done, f"reading the answer {path!r} blocked"
    return reading.exception() if isinstance(reading.exception(), SandboxError) else reading.result()


async def test_an_answer_file_is_a_regular_file_inside_the_workdir_or_refused(
    docker_client: docker.DockerClient, hostroot_image: str
) -> None:
    provider = DockerProvider()
    async with await provider.open(SandboxSpec("sbx-answers", hostroot_image, "/work", (USR,))) as box:
        script = (
            "mkdir sub && printf 'the answer' > answer.txt && printf inner > sub/inner.txt && mkfifo pipe"
            " && ln -s /etc/hostname link && ln -s sub sublink && ln -s pipe tofifo"
        )
        made = await box.exec(["bash", "-c", script], {}, 30)
        assert made.exit_code == 0, made.stderr
        assert await read_or_hang(box, "answer.txt") == b"the answer"
        assert await read_or_hang(box, "./sub//inner.txt") == b"inner"
        # dockerd resolves a link on the way within the container's root (docs/docker.md §1)
        assert await read_or_hang(box, "sublink/inner.txt") == b"inner"
        assert await read_or_hang(box, "missing.txt") is None
        for path, why in [
            ("../../etc/hostname", "not a path inside the workdir"),
            ("/etc/hostname", "not a path inside the workdir"),
            ("link", "not a regular file"),
            ("pipe", "not a regular file"),
            ("tofifo", "not a regular file"),
            ("sub", "not a regular file"),
            (".", "not a path inside the workdir"),
        ]:
            refused = await read_or_hang(box, path)
            assert isinstance(refused, SandboxError) and why in str(refused), (path, refused)
    await provider.close()


async def test_a_file_that_grew_after_its_stat_is_read_within_the_bound_and_its_stream_closed(
    docker_client: docker.DockerClient, hostroot_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stat says small, the archive is large (a process still running rewrote it): the read stops
    at the bound, and the archive stream it leaves is closed, so the container's removal does not wait
    out the API timeout (docs/docker.md §1)."""
    provider = DockerProvider()
    box = await provider.open(SandboxSpec("sbx-grew", hostroot_image, "/work", (USR,)))
    try:
        made = await box.exec(["bash", "-c", f"head -c {MAX_FILE_BYTES + 200_000} /dev/zero > big"], {}, 30)
        assert made.exit_code == 0
        monkeypatch.setattr(docker_sandbox, "_path_stat", lambda container, path: {"mode": 0, "size": 1})
        refused = await read_or_hang(box, "big")
        assert isinstance(refused, SandboxError) and "changed while it was read" in str(refused)
    finally:
        closing = asyncio.ensure_future(box.close())
        done, _ = await asyncio.wait({closing}, timeout=30.0)  # the API timeout is 60 s
    assert done, "removing the container waited for the archive stream"
    assert run_containers(docker_client, "sbx-grew") == []
    await provider.close()
