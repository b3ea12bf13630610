"""modeltap/compat/engines.py: telling vLLM, SGLang, transformers serve and AReaL's proxy apart, and what
each is asked for its token ids."""

from __future__ import annotations

import pytest

from modeltap.compat.engines import SGLEXT_HEADERS, UNKNOWN, EngineInfo, chosen, identify, token_ask

# The discovery answers of docs/engines.md §1.7 and §2.7, abbreviated.
VLLM_MODELS = {
    "object": "list",
    "data": [{"id": "q", "owned_by": "vllm", "root": "/models/q", "permission": []}],
}
SGLANG_MODELS = {"object": "list", "data": [{"id": "q", "owned_by": "sglang", "root": "q"}]}
NO_ANSWER = {
    "/v1/models": None,
    "/version": None,
    "/server_info": None,
    "/get_server_info": None,
    "/health": None,
}
# transformers serve 5.24.0, pinned to a local model folder: answered by the engines tier's server.
TRANSFORMERS_MODELS = {
    "object": "list",
    "data": [
        {"owned_by": "local", "id": "/m", "object": "model", "created": 0, "status": {"value": "loaded"}}
    ],
}


def test_model_card_owner_names_the_engine_and_the_version_probe_its_release() -> None:
    assert identify(
        {**NO_ANSWER, "/v1/models": VLLM_MODELS, "/version": {"version": "0.11.0"}}
    ) == EngineInfo("vllm", "0.11.0", "GET /v1/models owned_by")
    sglang = identify({**NO_ANSWER, "/v1/models": SGLANG_MODELS, "/server_info": {"version": "0.5.23"}})
    assert (sglang.name, sglang.version) == ("sglang", "0.5.23")


def test_without_a_model_card_the_version_routes_tell() -> None:
    assert identify({**NO_ANSWER, "/version": {"version": "0.10.2"}}).name == "vllm"
    assert identify({**NO_ANSWER, "/get_server_info": {"version": "0.5.4", "tp_size": 1}}).name == "sglang"
    # vLLM's dev-mode /server_info holds no SGLang version.
    assert identify({**NO_ANSWER, "/server_info": {"vllm_config": "…", "version": "0.5.4"}}) == UNKNOWN


def test_openai_is_unknown() -> None:
    openai_models = {"object": "list", "data": [{"id": "gpt-x", "owned_by": "openai"}]}
    assert identify(NO_ANSWER) == UNKNOWN
    assert identify({**NO_ANSWER, "/v1/models": openai_models}) == UNKNOWN


def test_transformers_serve_and_areal_tell_themselves_by_their_model_cards_and_health() -> None:
    assert identify(
        {**NO_ANSWER, "/v1/models": TRANSFORMERS_MODELS, "/health": {"status": "ok"}}
    ) == EngineInfo("transformers", None, "GET /v1/models status")
    # A server that loads models on demand lists none before the first request: /health tells it.
    empty = {"object": "list", "data": []}
    assert identify({**NO_ANSWER, "/v1/models": empty, "/health": {"status": "ok"}}).name == "transformers"
    areal = identify({**NO_ANSWER, "/health": {"status": "ok", "initialized": True}})
    assert (areal.name, areal.source) == ("areal", "GET /health initialized")
    # vLLM and SGLang answer /health with an empty body (no JSON): their own probes still decide.
    assert identify({**NO_ANSWER, "/v1/models": VLLM_MODELS}).name == "vllm"


@pytest.mark.parametrize("engine", ["transformers", "areal"])
def test_engines_that_return_no_ids_are_never_asked(engine: str) -> None:
    info = chosen(engine)  # type: ignore[arg-type]
    assert info == EngineInfo(engine, None, "--engine")  # type: ignore[arg-type]
    assert token_ask(info, "chat", streamed=True, logprobs=True, body={}) is None


def test_the_operator_may_name_the_engine() -> None:
    assert chosen("auto") is None
    assert chosen("sglang") == EngineInfo("sglang", None, "--engine")
    with pytest.raises(ValueError, match="engine must be one of"):
        chosen("tgi")  # type: ignore[arg-type]


VLLM = EngineInfo("vllm")
SGLANG = EngineInfo("sglang")


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_vllm_is_asked_for_return_token_ids_everywhere(endpoint: str, streamed: bool) -> None:
    ask = token_ask(VLLM, endpoint, streamed=streamed, logprobs=False, body={})
    assert ask is not None and (ask.fields, ask.headers) == ({"return_token_ids": True}, {})


def test_sglang_streamed_chat_gets_the_sglext_headers_never_return_token_ids() -> None:
    # SGLang answers return_token_ids on a streamed chat with a 400 (docs/engines.md §2.1).
    for version in (None, "0.5.20", "0.5.23"):
        ask = token_ask(EngineInfo("sglang", version), "chat", streamed=True, logprobs=False, body={})
        assert ask is not None and (ask.fields, ask.headers) == ({}, SGLEXT_HEADERS)
    assert token_ask(EngineInfo("sglang", "0.5.19"), "chat", streamed=True, logprobs=False, body={}) is None


def test_sglang_versions_gate_the_chat_and_completions_fields() -> None:
    def ask(version: str | None, endpoint: str, streamed: bool = False) -> tuple[dict, dict] | None:
        found = token_ask(EngineInfo("sglang", version), endpoint, streamed=streamed, logprobs=False, body={})
        return None if found is None else (found.fields, found.headers)

    assert ask("0.5.18", "chat") == ({"return_token_ids": True}, {})
    assert ask("0.5.21", "chat") == ({}, SGLEXT_HEADERS)
    assert ask(None, "chat") == ({}, SGLEXT_HEADERS)
    assert ask("0.5.16", "chat") is None
    assert ask("0.5.17", "completions", streamed=True) == ({"return_token_ids": True}, {})
    assert ask("0.5.16", "completions") is None


def test_old_vllm_and_formats_without_ids_are_not_asked() -> None:
    assert token_ask(EngineInfo("vllm", "0.10.1.1"), "chat", streamed=False, logprobs=False, body={}) is None
    assert token_ask(VLLM, "messages", streamed=False, logprobs=False, body={}) is None
    assert token_ask(UNKNOWN, "chat", streamed=False, logprobs=False, body={}) is None


def test_logprobs_are_asked_in_each_format_and_the_clients_own_fields_are_kept() -> None:
    chat = token_ask(VLLM, "chat", streamed=True, logprobs=True, body={})
    completions = token_ask(SGLANG, "completions", streamed=False, logprobs=True, body={})
    assert chat is not None and chat.fields == {"return_token_ids": True, "logprobs": True}
    assert completions is not None and completions.fields == {"return_token_ids": True, "logprobs": 0}
    own = token_ask(
        VLLM, "chat", streamed=False, logprobs=True, body={"logprobs": False, "return_token_ids": True}
    )
    assert own is not None and own.fields == {} and not own
