"""Fixtures of the Docker tier: a real dockerd, the test image built with `docker import`, opencode
from the npm prefix `make agents` fills, and the AReaL stand-in.

Nothing here skips. Without a daemon, the image or the agent CLI, the tier fails and says what to run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from docker.models.containers import Container

from modeltap.adapter import shutdown
from modeltap.adapter.docker_sandbox import LABEL_OWNER, DockerProvider
from modeltap.proxy import network
from tests.adapter_harness import arithmetic
from tests.docker.hostroot import IMAGE, ensure_image
from tests.standins.areal import ArealStandIn

ROOT = Path(__file__).resolve().parents[2]
NODE_MODULES = ROOT / ".cache" / "npm" / "node_modules"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(f"the Docker tier needs a running dockerd ({exc}); run `make dockerd`")
    yield client
    client.close()


@pytest.fixture(scope="session")
def hostroot_image(docker_client: docker.DockerClient) -> str:
    """The test image's name, built (or found up to date) once per session."""
    ensure_image(docker_client)
    return IMAGE


@pytest.fixture(scope="session")
def node_modules() -> Path:
    """The npm prefix's node_modules, with opencode in it."""
    if not (NODE_MODULES / ".bin" / "opencode").exists():
        pytest.fail(f"opencode is not installed under {NODE_MODULES}; run `make agents`")
    return NODE_MODULES


@pytest.fixture(scope="session")
def bridge_host() -> str:
    """docker0's address: where the adapter's proxy listens for containers (and nowhere public)."""
    gateway = network.bridge_gateway()
    if gateway is None:
        pytest.fail("no docker0 interface: the Docker tier needs dockerd's default bridge")
    return gateway


@pytest.fixture
def areal() -> Iterator[ArealStandIn]:
    with ArealStandIn(script=arithmetic) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def own_containers(docker_client: docker.DockerClient) -> Callable[[], list[Container]]:
    """This test process's modeltap containers (other jobs on the same daemon have their own)."""
    owner = f"{LABEL_OWNER}={DockerProvider().owner}"

    def listed() -> list[Container]:
        return docker_client.containers.list(all=True, filters={"label": owner})

    return listed


@pytest.fixture(autouse=True)
def no_container_left(own_containers: Callable[[], list[Container]]) -> Iterator[None]:
    """Stop the adapter's background loop after each test, then check nothing it made remains."""
    yield
    shutdown()
    left = own_containers()
    for container in left:
        container.remove(force=True)
    assert not left, f"containers left behind: {[(c.name, c.labels) for c in left]}"
