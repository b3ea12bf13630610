"""Encoding helpers every stand-in shares, whatever its wire format: compact JSON, ids, streamed text,
and FastAPI's own answer to an unknown route (AReaL, vLLM and SGLang are all FastAPI apps).

Owns nothing backend-specific: the OpenAI and Anthropic shapes are in openai_wire.py and anthropic_wire.py.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any


def dumps(value: Any) -> bytes:
    """Compact JSON, as pydantic's `model_dump_json` (AReaL, vLLM) and the Anthropic API write it."""
    return json.dumps(value, separators=(",", ":")).encode()


def hex_id(prefix: str, length: int) -> str:
    """`prefix` followed by `length` random hex digits."""
    return prefix + secrets.token_hex((length + 1) // 2)[:length]


def text_pieces(text: str) -> list[str]:
    """Text as a server streams it: word by word, each piece keeping the spaces around it.

    >>> text_pieces("Shell arithmetic check")
    ['Shell ', 'arithmetic ', 'check']
    """
    return re.findall(r"\s*\S+\s*", text) or [text]


def fastapi_route_error(status: int) -> dict[str, str]:
    """FastAPI's body for its router's own 404 and 405."""
    return {"detail": "Not Found" if status == 404 else "Method Not Allowed"}
