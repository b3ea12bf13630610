"""The demo's scripted model: a stand-in model server for people who have none.

It answers OpenAI chat completions, OpenAI Responses and Anthropic Messages, each at `/v1/...` and at
the bare path, non-streamed or streamed, and `GET /v1/models` (and `/models`). Every answer follows
one script: a conversation that holds a tool result gets the text "42"; one that offers a shell tool
(opencode's and mini-swe-agent's `bash`, Claude Code's `Bash`, Codex's `exec_command` or `shell`, Qwen
Code's `run_shell_command`) gets a call to it running `echo $((6 * 7))`; anything else (an agent's
title request, a "Say hi") gets a greeting. Responses and Messages are answered through the same
conversions to and from chat modeltap translates with (modeltap/proxy/translate.py), so what a client
gets is what modeltap itself would write for a chat-only server.

Owns: the script, the routes and `start_model`. Does not own: the wire formats (modeltap/dialects),
the demo's conversation (play.py).

    runner, url = await start_model("127.0.0.1", 0)      # url: http://127.0.0.1:PORT
    ...
    await runner.cleanup()
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from modeltap import dialects
from modeltap.dialects.base import ApiError
from modeltap.dialects.roles import Dialect, Streams, ThroughChat
from modeltap.proxy.errors import BadRequest
from modeltap.proxy.translate import ResponseChains, Translation

DEMO_MODEL = "demo-model"
SHELL_COMMAND = "echo $((6 * 7))"
FINAL_ANSWER = "42"
# What a request offering no shell tool gets (an agent's title request, a "Say hi").
GREETING = "Hello from modeltap's scripted demo model"
# The agents' shell tools, by name (lower case): opencode and mini-swe-agent `bash`, Claude Code
# `Bash`, Codex `exec_command` (its argument is `cmd`) or `shell`, Qwen Code `run_shell_command`
# (docs/agents.md §0).
SHELL_TOOLS = frozenset({"bash", "shell", "exec_command", "run_shell_command"})
# The usage the script reports: a made-up count (the script has no tokenizer), the same for every
# format, so the readers have tokens to show.
PROMPT_TOKENS_PER_MESSAGE = 20
COMPLETION_TOKENS = 5
MODEL_BANNER = f"""modeltap demo --model-only: scripted model {DEMO_MODEL}, to try modeltap without a server
  serves  chat completions, Responses and Messages, at /v1/... and at the bare path; streams and tool
          calls; GET /v1/models
  script  a shell tool offered: a call running `{SHELL_COMMAND}`; a tool result in: "{FINAL_ANSWER}";
          anything else: a greeting"""
_CHAT = dialects.named("chat")
_SERVED = ("chat", "responses", "messages")
_CHAINS: web.AppKey[ResponseChains] = web.AppKey("chains", ResponseChains)


def scripted_reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The scripted model's next assistant message (OpenAI chat): "42" once a tool result is in, a
    call of the offered shell tool before that, and a greeting for requests that offer no shell tool."""
    if any(isinstance(m, dict) and m.get("role") == "tool" for m in messages):
        return {"role": "assistant", "content": FINAL_ANSWER}
    shell = next(
        (
            t["function"]
            for t in tools or []
            if isinstance(t, dict)
            and isinstance(t.get("function"), dict)
            and str(t["function"].get("name", "")).lower() in SHELL_TOOLS
        ),
        None,
    )
    if shell is None:
        return {"role": "assistant", "content": GREETING}
    properties = (shell.get("parameters") or {}).get("properties") or {}
    key = "cmd" if "cmd" in properties and "command" not in properties else "command"
    command: Any = SHELL_COMMAND
    if (properties.get(key) or {}).get("type") == "array":  # Codex's `shell`: an argv list
        command = ["bash", "-lc", SHELL_COMMAND]
    args: dict[str, Any] = {key: command}
    if "description" in properties:
        args["description"] = "Multiply six by seven"
    call = {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": shell["name"], "arguments": json.dumps(args)},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def chat_completion(body: dict[str, Any]) -> dict[str, Any]:
    """The script's answer to an OpenAI chat request, as a whole `chat.completion`."""
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    tools = body.get("tools") if isinstance(body.get("tools"), list) else None
    message = scripted_reply(messages, tools)
    prompt = PROMPT_TOKENS_PER_MESSAGE * len(messages)
    return {
        "id": "chatcmpl-" + uuid.uuid4().hex[:24],
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") if isinstance(body.get("model"), str) else DEMO_MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": prompt + COMPLETION_TOKENS,
        },
    }


def model_app(*, areal_layout: bool = False) -> web.Application:
    """The scripted model server: chat, Responses and Messages at `/v1/...` and bare, and the models.
    With `areal_layout`, only where AReaL 1.0's proxy serves them: chat and Responses at the bare path,
    Messages at `/v1/messages`, no models (docs/areal.md §1.1.1), so a client given `/v1` needs modeltap."""
    app = web.Application()
    app[_CHAINS] = ResponseChains()
    for name in _SERVED:
        dialect = dialects.named(name)
        prefixes = (("/v1/",) if dialect.areal_v1 else ("/",)) if areal_layout else ("/v1/", "/")
        for prefix in prefixes:
            app.router.add_post(prefix + dialect.route, _handler(dialect))
    if not areal_layout:
        for path in ("/v1/models", "/models"):
            app.router.add_get(path, _models)
    return app


async def start_model(host: str, port: int, *, areal_layout: bool = False) -> tuple[web.AppRunner, str]:
    """The scripted model listening on `host:port` (0: a free port): its runner and base URL."""
    runner = web.AppRunner(model_app(areal_layout=areal_layout), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, f"http://{host}:{runner.addresses[0][1]}"


def next_steps(url: str) -> str:
    """What to run next, in another terminal, once the model listens at `url`."""
    return f"  next    modeltap serve --upstream {url}    (in another terminal; Ctrl-C stops this model)"


async def _models(request: web.Request) -> web.Response:
    entry = {"id": DEMO_MODEL, "object": "model", "created": 0, "owned_by": "modeltap-demo"}
    return web.json_response({"object": "list", "data": [entry]})


def _handler(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return _error(dialect, 400, "the body must be a JSON object")
        if isinstance(dialect, ThroughChat):
            return await _answer_through_chat(request, dialect, body)
        return await _answer_chat(request, body)

    return handle


async def _answer_chat(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    reply = chat_completion(body)
    if body.get("stream") is not True:
        return web.json_response(reply)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    assert isinstance(_CHAT, Streams)
    return await _stream(request, _CHAT.synthesise(reply, include_usage))


async def _answer_through_chat(
    request: web.Request, dialect: ThroughChat, body: dict[str, Any]
) -> web.StreamResponse:
    """Responses or Messages: the request as chat, the script's chat answer back in the format."""
    chains = request.app[_CHAINS]
    try:
        translation = Translation.start(dialect, body, chains, None)
    except BadRequest as exc:
        return _error(dialect, 400, str(exc))
    chat = chat_completion(translation.chat_body)
    if translation.streamed:
        events, reply = translation.events(chat)
    else:
        events, reply = [], translation.reply(chat)
    translation.remember(chains, None, chat, reply)
    if translation.streamed:
        return await _stream(request, events)
    return web.json_response(reply)


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


def _error(dialect: Dialect, status: int, message: str) -> web.Response:
    return web.json_response(dialect.error_body(ApiError(message)), status=status)
