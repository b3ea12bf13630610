"""AReaL 2.0's v2 inference service as a test fixture: its router, data proxy and gateway, started as
AReaL's controller starts them, in front of a stand-in SGLang server.

Owns: the three processes (`python -m areal.v2.inference_service.{router,data_proxy,gateway}`, each on a
free loopback port with a non-default admin key), registering the data proxy in the router as
`RolloutControllerV2._register_data_proxies_in_router` does, and `FakeSGLang`, the one thing AReaL's
service cannot have here: SGLang's `/generate` with a GPU model. It answers the data proxy's token ids
with the scripted model of tests/areal/fake_engine.py, as SGLang's response (`meta_info.finish_reason`,
`output_token_logprobs`) that `SGLangBackend.parse_generation_response` reads.

Does not own: modeltap, the controller or the workflow (the tests build them).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from tests.areal.fake_engine import fake_logprob, scripted_reply
from tests.areal.processes import free_loopback_port, stop_servers, wait_healthy
from tests.standins import server
from tests.standins.wire import fastapi_route_error

# Each service imports torch, transformers and litellm through areal's package init: 8-15 s on two cores.
STARTUP_TIMEOUT_S = 180.0


def _generate_error(kind: server.FaultKind, body: Any) -> tuple[int, Any]:
    return 500, {"object": "error", "message": f"injected {kind}", "code": 500}


SGLANG = server.Dialect(
    name="sglang-generate",
    model_paths=frozenset({"/generate"}),
    route_error=fastapi_route_error,
    fault_error=_generate_error,
    broken_sse=b"",
)


def fake_sglang(tokenizer: Any) -> server.StandIn:
    """SGLang's `/generate` and `/health`, answering from `scripted_reply` with `tokenizer`'s ids."""

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        params = body.get("sampling_params") or {}
        output = tokenizer.encode(
            scripted_reply(tokenizer.decode(body["input_ids"])), add_special_tokens=False
        )
        limit = int(params.get("max_new_tokens") or len(output) + 1)
        if len(output) + 1 > limit:
            output, finish = output[:limit], {"type": "length", "length": limit}
        else:
            output, finish = (
                [*output, tokenizer.eos_token_id],
                {"type": "stop", "matched": tokenizer.eos_token_id},
            )
        meta = {
            "finish_reason": finish,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(output),
            "output_token_logprobs": [[fake_logprob(t, i), t, None] for i, t in enumerate(output)],
        }
        return web.json_response({"text": tokenizer.decode(output), "meta_info": meta})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    routes = [web.post("/generate", generate), web.get("/health", health)]
    return server.StandIn(server.build_app(SGLANG, routes))


@dataclass
class V2Service:
    """The running router, data proxy and gateway; `gateway_url` is what agents are given."""

    admin_key: str
    router_url: str
    data_proxy_url: str
    gateway_url: str
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(
        cls, workdir: Path, backend_url: str, tokenizer_path: str, *, admin_key: str, engine_max_tokens: int
    ) -> V2Service:
        ports = [free_loopback_port() for _ in range(3)]
        router, data_proxy, gateway = (f"http://127.0.0.1:{port}" for port in ports)
        service = cls(admin_key, router, data_proxy, gateway, workdir)
        common = ["--host", "127.0.0.1", "--admin-api-key", admin_key, "--log-level", "info"]
        try:
            service._spawn("router", ["--port", str(ports[0]), *common])
            service._spawn(
                "data_proxy",
                [
                    "--port", str(ports[1]), *common, "--backend-addr", backend_url,
                    "--tokenizer-path", tokenizer_path, "--tool-call-parser", "qwen25",
                    "--engine-max-tokens", str(engine_max_tokens),
                ],
            )  # fmt: skip
            service._spawn("gateway", ["--port", str(ports[2]), *common, "--router-addr", router])
            urls = (("router", router), ("data_proxy", data_proxy), ("gateway", gateway))
            for process, (name, url) in zip(service.processes, urls, strict=True):
                wait_healthy(process, url, f"AReaL's {name}", service.logs / f"{name}.log", STARTUP_TIMEOUT_S)
            registered = httpx.post(
                f"{router}/register",
                json={"worker_addr": data_proxy},
                headers={"Authorization": f"Bearer {admin_key}"},
                timeout=10,
            )
            registered.raise_for_status()
        except BaseException:
            service.stop()
            raise
        return service

    def _spawn(self, name: str, args: list[str]) -> None:
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", f"areal.v2.inference_service.{name}", *args]
        with (self.logs / f"{name}.log").open("wb") as log:
            self.processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))

    def stop(self) -> None:
        """SIGINT each process, as AReaL's scheduler does, then kill what hangs. Idempotent."""
        stop_servers(self.processes)
