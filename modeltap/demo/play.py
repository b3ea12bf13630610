"""`modeltap demo`: the main job on embedded defaults, start to finish, on loopback.

It starts the scripted model (model.py) laid out like AReaL's proxy (chat at the bare path only, so a
client configured with `/v1` would get 404 without modeltap: docs/areal.md §1.1.1), puts modeltap in
front of it, plays a short tool-using agent conversation through it with the openai SDK (and with
opencode when it is installed), and prints what was recorded.

Owns: the demo's conversation. Does not own: the scripted model (model.py), anything the proxy does.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modeltap.demo.model import DEMO_MODEL, start_model
from modeltap.proxy.config import ProxyConfig
from modeltap.proxy.server import Proxy
from modeltap.readers.show import session_turns
from modeltap.records.reader import StoreReader

DEMO_PROMPT = "Run the shell command `echo $((6 * 7))` and reply with only the number it prints."
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
# Where `make` installs the agent CLIs (mk/install.mk), in the working folder or beside an editable
# install's source; PATH is searched first.
_NPM_BINS = [
    Path(".cache/npm/node_modules/.bin"),
    Path(__file__).resolve().parents[2] / ".cache/npm/node_modules/.bin",
]
# opencode run offline: every network feature off (docs/agents.md §3.2).
_OPENCODE_FLAGS = [
    "OPENCODE_" + flag
    for flag in (
        "DISABLE_AUTOUPDATE DISABLE_MODELS_FETCH DISABLE_DEFAULT_PLUGINS PURE DISABLE_LSP_DOWNLOAD "
        "DISABLE_SHARE DISABLE_CLAUDE_CODE DISABLE_EXTERNAL_SKILLS"
    ).split()
]
OPENCODE_TIMEOUT_S = 120


async def run_demo(store: str, say: Callable[[str], None] = print) -> int:
    """Play the demo, print what was recorded, and return a process exit code."""
    try:
        from openai import AsyncOpenAI
    except ImportError:
        say("modeltap demo drives the openai SDK: pip install 'modeltap[demo]'")
        return 1
    runner, model_url = await start_model("127.0.0.1", 0, areal_layout=True)
    try:
        config = ProxyConfig(upstream=model_url, host="127.0.0.1", port=0, store=store, model=DEMO_MODEL)
        async with Proxy(config) as proxy:
            session = proxy.sessions.open(labels={"task_id": "demo", "agent": "openai-sdk"})
            say(f"scripted model (AReaL's layout: chat at the bare /chat/completions, no /v1) at {model_url}")
            say(f"modeltap at {proxy.host_base_url}; the agent is given {session.host_base_url}/v1\n")
            client = AsyncOpenAI(base_url=session.host_base_url + "/v1", api_key="unused", max_retries=0)
            await _sdk_conversation(client, say)
            await client.close()
            opencode_session = await _opencode_conversation(proxy, say)
        with StoreReader(store) as reader:
            for sid in filter(None, (session.id, opencode_session)):
                say("\n" + session_turns(sid, reader.exchanges(sid)))
        say(f"\nRecorded in {store}. Try: modeltap sessions --store {store}")
        return 0
    finally:
        await runner.cleanup()


async def _sdk_conversation(client: Any, say: Callable[[str], None]) -> None:
    models = await client.models.list()
    say(f"models: {[m.id for m in models.data]}")
    messages: list[dict[str, Any]] = [{"role": "user", "content": DEMO_PROMPT}]
    first = await client.chat.completions.create(model=DEMO_MODEL, messages=messages, tools=[BASH_TOOL])
    call = first.choices[0].message.tool_calls[0]
    command = json.loads(call.function.arguments)["command"]
    shell = await asyncio.create_subprocess_exec("bash", "-c", command, stdout=asyncio.subprocess.PIPE)
    output = (await shell.communicate())[0].decode()
    say(f"turn 1: the model calls {call.function.name}({command!r}); the shell prints {output.strip()!r}")
    messages += [first.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "tool", "tool_call_id": call.id, "content": output}]
    stream = await client.chat.completions.create(
        model=DEMO_MODEL,
        messages=messages,
        tools=[BASH_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    say(f"turn 2 (streamed): the model answers {text!r}")


async def _opencode_conversation(proxy: Proxy, say: Callable[[str], None]) -> str | None:
    binary = _find_opencode()
    if binary is None:
        say("opencode is not installed (make demo installs it into .cache/npm): skipping the opencode run")
        return None
    session = proxy.sessions.open(labels={"task_id": "demo", "agent": "opencode"})
    with tempfile.TemporaryDirectory(prefix="modeltap-demo-") as home:
        env = _opencode_env(home, session.host_base_url + "/v1")
        proc = await asyncio.create_subprocess_exec(
            binary, "run", DEMO_PROMPT, cwd=home, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), OPENCODE_TIMEOUT_S)
    say(f"opencode through modeltap printed {out.decode().strip()!r} (exit {proc.returncode})")
    return session.id


def _find_opencode() -> str | None:
    """opencode's absolute path: it runs in a scratch folder, where a relative one would not resolve."""
    binary = shutil.which("opencode") or shutil.which("opencode", path=os.pathsep.join(map(str, _NPM_BINS)))
    return str(Path(binary).resolve()) if binary else None


def _opencode_env(home: str, base_url: str) -> dict[str, str]:
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "modeltap demo",
        "options": {"baseURL": base_url, "apiKey": "unused"},
        "models": {
            DEMO_MODEL: {"name": DEMO_MODEL, "tool_call": True, "limit": {"context": 32000, "output": 1024}}
        },
    }
    config = {
        "autoupdate": False,
        "share": "disabled",
        "model": f"demo/{DEMO_MODEL}",
        "small_model": f"demo/{DEMO_MODEL}",
        "enabled_providers": ["demo"],
        "provider": {"demo": provider},
    }
    dirs = {"CONFIG": ".config", "DATA": ".local/share", "CACHE": ".cache", "STATE": ".local/state"}
    xdg = {f"XDG_{kind}_HOME": f"{home}/{sub}" for kind, sub in dirs.items()}
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        **xdg,
        **dict.fromkeys(_OPENCODE_FLAGS, "1"),
        # Without this opencode installs a plugin from the npm registry on every start (docs/agents.md §3.3).
        "npm_config_offline": "true",
        "OPENCODE_CONFIG_CONTENT": json.dumps(config),
    }
