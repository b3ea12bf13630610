"""Tests for modeltap/compat/layouts.py: path layouts, error-body parsing and error classification.

The messages are verbatim from docs/ (token-budgets.md, areal.md, agents.md); a paraphrase here would
test nothing.
"""

from __future__ import annotations

import json

import pytest

from modeltap.compat.layouts import (
    ErrorInfo,
    classify,
    is_context_overflow,
    is_route_level_404,
    overflow_tokens,
    parse_error,
    upstream_paths,
)


@pytest.mark.parametrize(
    ("layout", "route", "base_has_v1", "expected"),
    [
        ("areal", "chat/completions", False, ["/chat/completions"]),
        ("areal", "responses", False, ["/responses"]),
        ("areal", "messages", False, ["/v1/messages"]),
        ("openai", "chat/completions", False, ["/v1/chat/completions"]),
        ("auto", "chat/completions", False, ["/v1/chat/completions", "/chat/completions"]),
        ("openai", "chat/completions", True, ["/chat/completions"]),
        ("areal", "messages", True, ["/messages"]),
        ("areal-gateway", "chat/completions", False, ["/v1/chat/completions"]),
        ("areal-gateway", "models", False, []),  # admin key only on the gateway: answered by modeltap
        ("areal-gateway", "messages", False, []),
        ("areal-gateway", "responses", False, []),
        ("areal-gateway", "embeddings", False, []),
        ("chat-only", "chat/completions", False, ["/v1/chat/completions"]),
        ("chat-only", "embeddings", False, ["/v1/embeddings"]),
        ("chat-only", "messages", False, []),
        ("chat-only", "messages/count_tokens", True, []),
        ("chat-only", "responses", True, []),
    ],
)
def test_upstream_paths(layout, route, base_has_v1, expected):
    areal_v1 = route == "messages"  # AReaL serves its Anthropic route under /v1
    assert upstream_paths(layout, route, areal_v1=areal_v1, base_has_v1=base_has_v1) == expected


def test_auto_tries_areal_first_where_areal_is_installed():
    assert upstream_paths("auto", "chat/completions", auto_first="areal") == [
        "/chat/completions",
        "/v1/chat/completions",
    ]
    # AReaL's Anthropic route is under /v1 already: its other candidate is the bare one
    assert upstream_paths("auto", "messages", areal_v1=True, auto_first="areal") == [
        "/v1/messages",
        "/messages",
    ]


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (404, b'{"detail":"Not Found"}', True),  # FastAPI / AReaL, docs/areal.md §1.1.1
        (404, b"404: Not Found", True),  # aiohttp plain text
        (404, b'{"error":{"message":"The model `x` does not exist","code":"model_not_found"}}', False),
        (404, b'{"type":"error","error":{"type":"not_found_error","message":"model: x"}}', False),
        (404, b'{"object":"error","message":"not found","code":404}', False),
        (400, b'{"detail":"Not Found"}', False),
    ],
)
def test_is_route_level_404(status, body, expected):
    assert is_route_level_404(status, body) is expected


# (status, body, expected ErrorInfo) for every shape in the module's table.
SHAPES = [
    pytest.param(
        500,
        b'{"detail":"len of prompt tokens 609 exceeds max_total_tokens 256"}',
        ErrorInfo(500, "len of prompt tokens 609 exceeds max_total_tokens 256", None, None),
        id="fastapi-detail-str",
    ),
    pytest.param(
        422,
        b'{"detail":[{"loc":["header","content-type"],"msg":"Unsupported Media Type: Only '
        b'\'application/json\' is allowed","type":"value_error"}]}',
        ErrorInfo(
            422,
            "header.content-type: Unsupported Media Type: Only 'application/json' is allowed",
            "value_error",
            None,
        ),
        id="fastapi-detail-list",
    ),
    pytest.param(
        400,
        b'{"object":"error","message":"Requested token count exceeds the model\'s maximum context length'
        b' of 4096 tokens.","type":"BadRequestError","param":null,"code":400}',
        ErrorInfo(
            400,
            "Requested token count exceeds the model's maximum context length of 4096 tokens.",
            "BadRequestError",
            400,
        ),
        id="sglang-flat",
    ),
    pytest.param(
        400,
        b'{"error":{"message":"m","type":"BadRequestError","param":"input_tokens","code":400}}',
        ErrorInfo(400, "m", "BadRequestError", 400),
        id="vllm-nested",
    ),
    pytest.param(
        400,
        b'{"error":{"message":"m","type":"invalid_request_error","param":"messages",'
        b'"code":"context_length_exceeded"}}',
        ErrorInfo(400, "m", "invalid_request_error", "context_length_exceeded"),
        id="openai-nested",
    ),
    pytest.param(
        400,
        b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208656'
        b' tokens > 200000 maximum"},"request_id":"req_1"}',
        ErrorInfo(400, "prompt is too long: 208656 tokens > 200000 maximum", "invalid_request_error", None),
        id="anthropic",
    ),
    pytest.param(502, b"Backend unreachable", ErrorInfo(502, "Backend unreachable", None, None), id="text"),
    pytest.param(500, b"", ErrorInfo(500, "", None, None), id="empty"),
    pytest.param(
        401,
        {"detail": "Invalid or expired session API key."},
        ErrorInfo(401, "Invalid or expired session API key.", None, None),
        id="already-parsed",
    ),
]


@pytest.mark.parametrize(("status", "body", "expected"), SHAPES)
def test_parse_error_reads_every_shape(status, body, expected):
    assert parse_error(status, body) == expected


def test_parse_error_takes_str_as_well_as_bytes():
    body = '{"detail":"Session zzz not found"}'
    assert parse_error(404, body) == parse_error(404, body.encode())


# Every overflow message in docs/, verbatim (numbers filled in as measured).
OVERFLOWS = [
    # OpenAI, docs/token-budgets.md §4.1 and §7.3
    (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your messages"
                " resulted in 9000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
    ),
    # only the code says it
    (
        400,
        {
            "error": {
                "message": "too long",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    ),
    # SGLang tokenizer manager, total and prompt alone (docs/token-budgets.md §1.1)
    (
        400,
        {
            "object": "error",
            "message": "Requested token count exceeds the model's maximum context length of 4096 tokens. You"
            " requested a total of 4200 tokens: 4100 tokens from the input messages and 100 tokens for the"
            " completion. Please reduce the number of tokens in the input messages or the completion to fit"
            " within the limit.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    (
        400,
        {
            "object": "error",
            "message": "The input (5000 tokens) is longer than the model's context length (4096 tokens).",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
    ),
    # SGLang scheduler (docs/token-budgets.md §1.1 step 4; not in LiteLLM's list, §6)
    (
        400,
        {
            "object": "error",
            "message": "Input length (4090 tokens) exceeds the maximum allowed length"
            " (4090 tokens). Use a shorter input or enable --allow-auto-truncate.",
            "code": 400,
        },
    ),
    # vLLM 0.33 (docs/token-budgets.md §2.1)
    (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 4096 tokens. However, your prompt"
                " contains at least 4097 input tokens, which exceeds this limit even without any output"
                " tokens. Please reduce the length of the input prompt.",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
    ),
    (
        400,
        {
            "error": {
                "message": "The decoder prompt (length 4096) plus the number of requested output tokens"
                " (at least 1) is longer than the maximum model length of 4096.",
                "code": 400,
            }
        },
    ),
    (
        400,
        {
            "error": {
                "message": "Input length (5000) exceeds model's maximum context length (4096).",
                "code": 400,
            }
        },
    ),
    # earlier vLLM (docs/token-budgets.md §2.2)
    (
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you"
            " requested 4200 tokens (4100 in the messages, 100 in the completion). Please reduce the"
            " length of the messages or completion.",
            "code": 400,
        },
    ),
    (
        400,
        {
            "error": {
                "message": "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's"
                " maximum context length is 4096 tokens and your request has 4000 input tokens"
                " (100 > 4096 - 4000).",
                "code": 400,
            }
        },
    ),
    (
        400,
        {
            "error": {
                "message": "You passed 4000 input tokens and requested 200 output tokens. However, the"
                " model's context length is only 4096 tokens, resulting in a maximum input length of"
                " 3896 tokens. Please reduce the length of the input prompt.",
                "code": 400,
            }
        },
    ),
    (
        400,
        {
            "error": {
                "message": "This model's maximum context length is 4096 tokens. However, you requested"
                " 200 output tokens and your prompt contains at least 3897 input tokens, for a total of"
                " at least 4097 tokens. Please reduce the length of the input prompt or the number of"
                " requested output tokens. (parameter=input_tokens, value=3897)",
                "code": 400,
            }
        },
    ),
    # Anthropic (docs/token-budgets.md §4.2; docs/agents.md §2.5)
    (
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        },
    ),
    # AReaL's 500 details (docs/areal.md §4.1, §10.5)
    (500, {"detail": "len of prompt tokens 609 exceeds max_total_tokens 256"}),
    (500, {"detail": "Streaming setup failed: 500: len of prompt tokens 609 exceeds max_total_tokens 256"}),
    (500, {"detail": "len of prompt tokens 609 exceeds engine_max_tokens 256"}),
    (
        500,
        {
            "detail": "RuntimeError: max_new_tokens (-8) is non-positive! max_tokens=32768, prompt_len=32776,"
            " max_new_tokens=512."
        },
    ),
    (
        500,
        {
            "detail": "RuntimeError: Failed after 3 retries each. Payload: {'input_ids': [1, 2, 3]}."
            " Addr: 10.0.0.5:30000. Endpoint: /generate. Last error: 400"
        },
    ),
    # AReaL before 2025-12 (docs/token-budgets.md §3)
    (500, {"detail": "max_tokens must be greater than the number of prompt tokens"}),
]


@pytest.mark.parametrize(("status", "doc"), OVERFLOWS)
def test_every_known_overflow_is_a_model_fault(status, doc):
    assert classify(status, json.dumps(doc).encode()) == "model_fault"


NOT_OVERFLOWS = [
    # asking for more completion than the whole window is a client setting
    # (docs/token-budgets.md §1.1, §2.1)
    (
        400,
        {
            "object": "error",
            "message": "max_completion_tokens is too large: 999999.This model supports at"
            " most 4096 completion tokens.",
            "code": 400,
        },
        "client_error",
    ),
    (
        400,
        {
            "error": {
                "message": "max_completion_tokens=999999 cannot be greater than max_model_len=4096."
                " Please request fewer output tokens.",
                "code": 400,
            }
        },
        "client_error",
    ),
    # AReaL (docs/areal.md §1.1.3, §1.3, §10.5)
    (401, {"detail": "Invalid or expired session API key."}, "client_error"),
    (404, {"detail": "Not Found"}, "client_error"),
    (
        422,
        {"detail": [{"loc": ["body", "model"], "msg": "Field required", "type": "missing"}]},
        "client_error",
    ),
    (429, {"detail": "No available capacity to start a new session"}, "upstream_error"),
    (
        500,
        {
            "detail": "max_tokens and max_completion_tokens cannot be set at the same time. max_tokens has"
            " been deprecated."
        },
        "client_error",
    ),
    (500, {"detail": "messages cannot be empty"}, "client_error"),
    (500, {"detail": "NotImplementedError: n != 1 is not supported yet"}, "client_error"),
    (500, {"detail": "Internal server error during request conversion."}, "upstream_error"),
    # OpenAI-style, from the stand-in of docs/agents.md §2.5, §3.6
    (
        404,
        {
            "error": {
                "message": "The model `standin-missing` does not exist or you do not have access to it.",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
        },
        "client_error",
    ),
    (
        401,
        {"error": {"message": "Incorrect API key provided: sk-test***.", "code": "invalid_api_key"}},
        "client_error",
    ),
    (
        500,
        {
            "error": {
                "message": "The server had an error while processing your request.",
                "type": "server_error",
            }
        },
        "upstream_error",
    ),
    (
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        "upstream_error",
    ),
    (408, {"detail": "Session wait timed out"}, "upstream_error"),
]


@pytest.mark.parametrize(("status", "doc", "expected"), NOT_OVERFLOWS)
def test_other_errors_are_classified_by_status(status, doc, expected):
    assert classify(status, json.dumps(doc).encode()) == expected


def test_gateway_plain_text_502_is_an_upstream_error():
    # AReaL's gateway answers a dead worker with plain text (docs/areal.md §1.2).
    assert classify(502, b"Backend unreachable") == "upstream_error"


def test_an_error_body_nested_past_the_parser_is_read_as_its_text():
    # An upstream may answer anything; a body deeper than Python's JSON reads is text, not a crash.
    deep = b"[" * 1200
    assert parse_error(500, deep) == ErrorInfo(500, deep.decode(), None, None)
    assert classify(500, deep) == "upstream_error"
    assert is_route_level_404(404, deep)


def test_overflow_detection_ignores_case():
    assert is_context_overflow(ErrorInfo(400, "PROMPT IS TOO LONG: 5 tokens > 4 maximum", None, None))
    assert not is_context_overflow(ErrorInfo(400, "prompt is fine", None, None))


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in "
            "the messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            (4000, 4096),
        ),
        (
            "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 "
            "tokens. Please reduce the length of the messages.",
            (9000, 8192),
        ),
        ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", (5000, 4096)),
        ("Streaming setup failed: 500: len of prompt tokens 609 exceeds max_total_tokens 256", (609, 256)),
        ("len of prompt tokens 70 exceeds engine_max_tokens 64", (70, 64)),
        ("prompt is too long: 210000 tokens > 200000 maximum", (210000, 200000)),
        ("exceeds the maximum allowed length", None),
    ],
)
def test_overflow_tokens_reads_the_numbers_each_wording_states(message, expected):
    assert overflow_tokens(message) == expected
