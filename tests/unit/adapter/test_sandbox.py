"""modeltap/adapter/sandbox.py: LocalSandbox (process groups on the host) and what every sandbox shares.
DockerSandbox runs against a real dockerd in tests/docker/test_docker_sandbox.py."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeltap.adapter import local_sandbox
from modeltap.adapter.bundle import Mount
from modeltap.adapter.local_sandbox import LocalProvider
from modeltap.adapter.sandbox import (
    OUTPUT_HEAD_BYTES,
    OUTPUT_TAIL_BYTES,
    BoundedOutput,
    ExecResult,
    SandboxError,
    SandboxSpec,
    provider_for,
)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


async def wait_for_pid(path: Path, timeout_s: float = 10.0) -> int:
    """The pid a command writes to `path`, once it has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""  # noqa: ASYNC240 (a tiny file, polled)
        if text.strip():
            return int(text)
        await asyncio.sleep(0.02)
    raise AssertionError(f"no pid in {path} after {timeout_s} s")


async def wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_command_runs_in_the_workdir_with_its_env_and_a_home_of_its_own(tmp_path: Path) -> None:
    mount = Mount("data", tmp_path, "/opt/data")
    async with await LocalProvider().open(SandboxSpec("r1", None, "/work", (mount,))) as box:
        result = await box.exec(
            ["sh", "-c", 'pwd; echo "$HOME"; echo "$GREETING"; echo oops >&2; exit 3'], {"GREETING": "hi"}, 10
        )
        assert box.endpoint_kind == "host"
        assert box.mount_path(mount) == str(tmp_path)  # on the host a mount is its source
    workdir, home, greeting = result.stdout.split()
    assert (result.exit_code, result.stderr, greeting) == (3, "oops\n", "hi")
    assert workdir == box.workdir and home == box.home and home != os.environ.get("HOME")
    assert not os.path.exists(workdir)  # noqa: ASYNC240 (closing removed the run's directory)
    assert "(exit 3," in box.logs[0] and "--- stderr ---\noops" in box.logs[0]


async def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    async with await LocalProvider().open(SandboxSpec("r2", None, "/work")) as box:
        started = time.monotonic()
        result = await box.exec(["sh", "-c", "sleep 60 & echo $! > child.pid; sleep 60"], {}, 0.5)
        assert result.timed_out and result.exit_code is None
        assert time.monotonic() - started < 5
        child = int((Path(box.workdir) / "child.pid").read_text())
        assert await wait_gone(child), "the backgrounded grandchild outlived the timeout"
        assert "timed out" in box.logs[-1]


async def test_closing_kills_what_a_finished_command_left_running() -> None:
    box = await LocalProvider().open(SandboxSpec("r3", None, "/work"))
    result = await box.exec(["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], {}, 10)
    stray = int(result.stdout)
    assert result.exit_code == 0 and alive(stray)
    await box.close()
    assert await wait_gone(stray)
    await box.close()  # a second close does nothing


async def test_closing_kills_what_left_the_runs_groups() -> None:
    # A process that made a session of its own, and a daemon whose parent exited (now PID 1's child):
    # neither is in a process group the run started.
    escape = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
    escape += "        open('daemon.pid', 'w').write(str(os.getpid())); time.sleep(300)\n    os._exit(0)\n"
    box = await LocalProvider().open(SandboxSpec("r8", None, "/work"))
    setsid = await box.exec(["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"], {}, 10)
    await box.exec([sys.executable, "-c", escape], {}, 10)
    strays = [int(setsid.stdout), await wait_for_pid(Path(box.workdir) / "daemon.pid")]
    try:
        assert all(alive(pid) for pid in strays)
        assert all(os.getpgid(pid) not in box._groups for pid in strays)
        await box.close()
        assert [await wait_gone(pid) for pid in strays] == [True, True]
    finally:
        for pid in strays:
            if alive(pid):
                os.kill(pid, 9)


async def test_cancelling_a_command_kills_its_group_before_the_cancel_propagates() -> None:
    async with await LocalProvider().open(SandboxSpec("r4", None, "/work")) as box:
        task = asyncio.ensure_future(box.exec(["sh", "-c", "echo $$ > pid; exec sleep 60"], {}, 60))
        pid = await wait_for_pid(Path(box.workdir) / "pid")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await wait_gone(pid, timeout_s=1.0)


async def test_a_command_ends_with_its_process_though_one_outside_its_group_holds_its_output() -> None:
    """A process that leaves the group (setsid, a daemon) keeps the command's stdout open; the
    command, and its cancellation, still end when the command's own process does."""
    async with await LocalProvider().open(SandboxSpec("r7", None, "/work")) as box:
        pids = [Path(box.workdir) / "ended.pid", Path(box.workdir) / "cancelled.pid"]

        def escaping(pid_file: Path, then: str) -> list[str]:
            return ["sh", "-c", f"setsid sleep 30 & echo $! > {pid_file.name}; {then}"]

        try:
            run = asyncio.ensure_future(box.exec(escaping(pids[0], "echo done"), {}, 600))
            done, _ = await asyncio.wait({run}, timeout=10.0)  # a hang detector, not a speed limit
            assert done, "the command waited for a process outside its group"
            assert run.result().exit_code == 0 and run.result().stdout == "done\n"
            cancelled = asyncio.ensure_future(box.exec(escaping(pids[1], "exec sleep 600"), {}, 600))
            await wait_for_pid(pids[1])
            cancelled.cancel()
            done, _ = await asyncio.wait({cancelled}, timeout=10.0)
            assert done and cancelled.cancelled(), "the cancel waited for a process outside its group"
        finally:
            for pid in pids:
                if pid.exists():
                    os.kill(int(pid.read_text()), 9)


async def test_read_file_returns_bytes_none_for_a_missing_file_and_refuses_huge_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with await LocalProvider().open(SandboxSpec("r5", None, "/work")) as box:
        (Path(box.workdir) / "answer.txt").write_text("42\n")
        assert await box.read_file("answer.txt") == b"42\n"
        assert await box.read_file("missing.txt") is None
        monkeypatch.setattr(local_sandbox, "MAX_FILE_BYTES", 2)
        with pytest.raises(SandboxError, match="over the 2-byte limit"):
            await box.read_file("answer.txt")


def answer_tree(work: Path) -> Path:
    """What an agent can leave in its workdir where its answer is read: a regular file, one in a
    directory, links out of the workdir and within it, a FIFO and links to it; and beside the
    workdir, a file of the host that no answer may read."""
    (work.parent / "outside.txt").write_bytes(b"host secret")
    (work / "sub").mkdir(parents=True)
    (work / "answer.txt").write_bytes(b"the answer")
    (work / "sub" / "inner.txt").write_bytes(b"the inner answer")
    os.mkfifo(work / "pipe")
    (work / "link").symlink_to("/etc/hostname")
    (work / "up").symlink_to(work.parent / "outside.txt")
    (work / "sublink").symlink_to("sub")
    (work / "tofifo").symlink_to("pipe")
    (work / "sub" / "loop").symlink_to("../sub/loop")
    return work


def read_or_hang(work: Path, path: str) -> bytes | SandboxError | None:
    """`_read_inside`, in a thread so that a read that blocks fails the test instead of hanging it."""
    outcome: list[bytes | SandboxError | None] = []

    def read() -> None:
        try:
            outcome.append(local_sandbox._read_inside(work, path))
        except SandboxError as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10.0)  # a hang detector, not a speed limit
    assert outcome, f"reading the answer {path!r} blocked"
    return outcome[0]


async def test_an_answer_file_outside_the_workdir_a_link_or_a_fifo_is_refused_without_blocking() -> None:
    async def read(path: str) -> bytes | SandboxError | None:
        reading = asyncio.ensure_future(box.read_file(path))
        done, _ = await asyncio.wait({reading}, timeout=10.0)  # a hang detector, not a speed limit
        assert done, f"reading the answer {path!r} blocked"
        return reading.exception() if isinstance(reading.exception(), SandboxError) else reading.result()

    async with await LocalProvider().open(SandboxSpec("r9", None, "/work")) as box:
        answer_tree(Path(box.workdir))
        for path, expected in [
            ("answer.txt", b"the answer"),
            ("./sub//inner.txt", b"the inner answer"),
            ("missing.txt", None),
            ("answer.txt/below", None),
        ]:
            assert await read(path) == expected, path
        for path, why in [
            ("../outside.txt", "not a path inside the workdir"),
            ("../../etc/hostname", "not a path inside the workdir"),
            ("/etc/hostname", "not a path inside the workdir"),
            (".", "not a path inside the workdir"),
            ("link", "symlink"),
            ("up", "symlink"),
            ("sublink/inner.txt", "symlink"),
            ("sub/loop", "symlink"),
            ("pipe", "not a regular file (a FIFO)"),
            ("tofifo", "symlink"),
            ("sub", "not a regular file (a directory)"),
        ]:
            refused = await read(path)
            assert isinstance(refused, SandboxError) and why in str(refused), (path, refused)


ANSWER_PARTS = ["answer.txt", "sub", "inner.txt", "link", "up", "sublink", "tofifo", "pipe", "loop"]
ANSWER_PARTS += ["..", ".", "", "outside.txt", "etc", "hostname", "work", "\0", " "]


@st.composite
def answer_paths(draw: st.DrawFn) -> str:
    lead = draw(st.sampled_from(["", "/", "./", "//", "../"]))
    parts = draw(st.lists(st.sampled_from(ANSWER_PARTS) | st.text(max_size=4), max_size=5))
    return lead + "/".join(parts)


def test_fuzzed_answer_paths_read_only_regular_files_inside_the_workdir(tmp_path: Path) -> None:
    work = answer_tree(tmp_path / "work")
    inside = {b"the answer", b"the inner answer"}

    @settings(max_examples=400, deadline=None)
    @given(answer_paths())
    def check(path: str) -> None:
        outcome = read_or_hang(work, path)
        if isinstance(outcome, bytes):
            assert outcome in inside, path
            # What was read is what the path names lexically, and no link was on the way.
            parts = Path(os.path.normpath(path)).parts
            assert ".." not in parts and not os.path.isabs(path), path
            assert (work.joinpath(*parts)).read_bytes() == outcome
            for depth in range(1, len(parts) + 1):
                assert not work.joinpath(*parts[:depth]).is_symlink(), path

    check()


async def test_a_missing_binary_is_a_sandbox_error_naming_it() -> None:
    async with await LocalProvider().open(SandboxSpec("r6", None, "/work")) as box:
        with pytest.raises(SandboxError, match="cannot start '/nonexistent/agent'"):
            await box.exec(["/nonexistent/agent"], {}, 5)


def test_bounded_output_keeps_head_and_tail_holds_a_bounded_amount_and_says_what_it_dropped() -> None:
    out = BoundedOutput(head=100, tail=1000)
    data = bytes(range(256)) * (40 * 4096)  # 40 MiB
    chunk = 65536
    for start in range(0, len(data), chunk):
        out.write(data[start : start + chunk])
        assert out.held <= 100 + 1000 + chunk  # never more than the bound and one chunk
    assert out.total == len(data) and out.dropped == len(data) - 1100
    expected_head = data[:100].decode("utf-8", errors="replace")
    expected_tail = data[-1000:].decode("utf-8", errors="replace")
    assert out.text() == f"{expected_head}\n[… {len(data) - 1100} bytes of output dropped …]\n{expected_tail}"
    small = BoundedOutput(head=100, tail=1000)
    for piece in (b"a" * 60, b"b" * 600, b"c" * 440):
        small.write(piece)
    assert small.dropped == 0 and small.text() == "a" * 60 + "b" * 600 + "c" * 440
    skipped = BoundedOutput(head=4, tail=4)
    skipped.write(b"0123")
    skipped.skip(100)
    skipped.write(b"wxyz")
    assert (skipped.total, skipped.dropped) == (108, 100)
    with pytest.raises(ValueError, match="right after a full head"):
        skipped.skip(1)
    one_big = BoundedOutput(head=4, tail=4)
    one_big.write(b"0123456789")
    assert one_big.text() == "0123\n[… 2 bytes of output dropped …]\n6789"


async def test_a_command_s_huge_output_is_kept_bounded_and_only_its_head_and_tail_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: list[int] = []

    class Counted(BoundedOutput):
        def write(self, chunk: bytes) -> None:
            read.append(len(chunk))
            super().write(chunk)

    monkeypatch.setattr(local_sandbox, "BoundedOutput", Counted)
    async with await LocalProvider().open(SandboxSpec("r8", None, "/work")) as box:
        result = await box.exec(["sh", "-c", "head -c 41943040 /dev/zero | tr '\\0' x; echo END"], {}, 60)
    dropped = 41943040 + 4 - OUTPUT_HEAD_BYTES - OUTPUT_TAIL_BYTES
    assert f"\n[… {dropped} bytes of output dropped …]\n" in result.stdout
    assert result.stdout.endswith("x" * 100 + "END\n")
    assert len(result.stdout) < OUTPUT_HEAD_BYTES + OUTPUT_TAIL_BYTES + 100
    assert sum(read) == OUTPUT_HEAD_BYTES + OUTPUT_TAIL_BYTES  # the 32 MB between were never read


def test_a_log_entry_keeps_the_tail_of_long_output() -> None:
    result = ExecResult(("agent", "run"), 0, "x" * 10_000 + "END", "", 1.25)
    entry = result.log_entry()
    assert entry.startswith("$ agent run  (exit 0, 1.2 s)")
    assert entry.endswith("END") and len(entry) < 4200
    assert "stderr" not in entry


def test_runner_names_map_to_providers() -> None:
    assert isinstance(provider_for("local"), LocalProvider)
    assert type(provider_for("docker")).__name__ == "DockerProvider"
    with pytest.raises(ValueError, match='use runner="docker" or runner="local"'):
        provider_for("podman")


def test_the_docker_runner_without_the_docker_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # what a base install without [adapter] has
    monkeypatch.delitem(sys.modules, "modeltap.adapter.docker_sandbox", raising=False)
    with pytest.raises(SandboxError, match=re.escape("pip install 'modeltap[adapter]'")):
        provider_for("docker")
    assert isinstance(provider_for("local"), LocalProvider)  # the local runner needs no docker
