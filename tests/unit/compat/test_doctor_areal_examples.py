"""`modeltap doctor` over every example config of AReaL 2.0.0 and main (tests/fixtures/areal_examples/),
with AReaL's own package on the path, unpacked from the source archives the AReaL tiers install
(`MODELTAP_AREAL_VENDOR`, by default `shared/vendor` beside the repository): no config crashes the
doctor, and the only findings are the true ones listed here.

The agent configs' findings hold on AReaL's own code: the v1 proxy and the v2 data proxy both cap prompt
plus completion at 32768 with engine_max_tokens unset (areal/experimental/openai/client.py
`_DEFAULT_MAX_TOTAL_TOKENS`); AReaL refuses the default admin key off loopback
(areal/infra/utils/http.py); openclaw's online agents reach the v1 proxy, which serves chat at the bare
path only. A config that names no workflow but writes agent settings gets one `info` saying the
agent-proxy rules could not tell (its training script picks the workflow).
"""

from __future__ import annotations

import os
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from modeltap.compat.doctor import check, load_config

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "tests" / "fixtures" / "areal_examples"
VENDOR = Path(os.environ.get("MODELTAP_AREAL_VENDOR", REPO.parent / "shared" / "vendor"))
TREES = {"2.0.0": "areal-2.0.0-src.tar.gz", "main-cbff54d": "areal-main-cbff54d-src.tar.gz"}
# What every tree's agent configs rightly get (rule:severity, sorted).
PROXY_ONLINE = ["decoupled-loss:warning", "engine-max-tokens:error", "micro-batches:error"]
EXPECTED = {
    # MathAgent / MathToolAgent through the v1 proxy, with the default admin key and no cap set;
    # actor and ref micro-batches of 10240 tokens. areal/workflow/openai is a namespace package.
    "examples/agent_workflow/config.yaml": [
        "admin-key:error", "decoupled-loss:warning", "engine-max-tokens:error", "micro-batches:error",
        "micro-batches:error",
    ],
    "examples/agent_workflow/config_claude.yaml": [
        "admin-key:error", "decoupled-loss:warning", "engine-max-tokens:error", "micro-batches:error",
        "micro-batches:error",
    ],
    # v2 (`rollout._version: v2`): the gateway serves /v1/chat/completions, so no v1-paths finding.
    "examples/experimental/inference_service/online_rollout.yaml": PROXY_ONLINE,
    "examples/hermes/config.yaml": PROXY_ONLINE,
    # online on the v1 proxy
    "examples/openclaw/config.yaml": [*PROXY_ONLINE, "v1-paths:warning"],
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(TREES))
def tree(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One AReaL tree's name, with its `areal` package importable (never imported: doctor reads it)."""
    name = request.param
    archive = VENDOR / TREES[name]
    if not archive.is_file():
        pytest.fail(
            f"{archive} is missing: the AReaL source archives must be there (or MODELTAP_AREAL_VENDOR)"
        )
    root = tmp_path_factory.mktemp(f"areal-{name}")
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/areal/" in m.name and m.isfile()]
        tar.extractall(root, members, filter="data")
    (source,) = root.iterdir()
    sys.path.insert(0, str(source))
    yield name
    sys.path.remove(str(source))
    sys.modules.pop("areal", None)


def test_every_example_config_gets_only_its_true_findings(tree: str) -> None:
    configs = sorted((EXAMPLES / tree).rglob("*.y*ml"))
    assert len(configs) > 60  # every example, not a sample of them
    unexpected = {}
    for path in configs:
        name = str(path.relative_to(EXAMPLES / tree))
        findings = check(load_config(str(path), []), env={}, gpu_memory_gb=80.0)
        got = sorted(f"{f.rule}:{f.severity}" for f in findings)
        if got != EXPECTED.get(name, []) and (name in EXPECTED or set(got) - {"workflow:info"}):
            unexpected[name] = [(f.rule, f.severity, f.title) for f in findings]
    assert unexpected == {}
    assert "areal" not in sys.modules
