"""modeltap/replay/replay.py: the replay comparison."""

from __future__ import annotations

from typing import Any

from modeltap.records.turns import turn_record
from modeltap.replay.replay import _compare, comparison_text


def test_comparison_flags_what_changed_and_diffs_the_content() -> None:
    def side(text: str, finish: str, status: int = 200) -> dict[str, Any]:
        ex = {
            "id": text,
            "seq": 1,
            "session_id": "s",
            "labels": {},
            "method": "POST",
            "endpoint": "chat",
            "path": "/v1/chat/completions",
            "status": status,
            "streamed": False,
            "stream_complete": None,
            "model": "m",
            "started": 1.0,
            "first_byte": 1.1,
            "ended": 1.5,
            "prompt_tokens": 5,
            "counted_prompt_tokens": None,
            "budget": None,
            "error_class": None,
            "error_message": None,
            "user_agent": None,
            "retry_count": None,
            "client_disconnected": False,
            "request": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            "response": {
                "choices": [{"message": {"content": text}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3},
            },
        }
        return ex

    recorded = side("line one\nforty-two", "stop")
    same = _compare(
        1, recorded, turn_record(recorded, 1), turn_record(side("line one\nforty-two", "stop"), 1)
    )
    changed = _compare(2, recorded, turn_record(recorded, 2), turn_record(side("line one\n41", "length"), 2))
    gone = _compare(3, recorded, turn_record(recorded, 3), None)
    assert same["differs"] == [] and changed["differs"] == ["finish_reason", "content"]
    assert gone["differs"] == ["status", "finish_reason", "prompt_tokens", "completion_tokens", "content"]
    text = comparison_text([same, changed])
    assert "turn 1  chat  /v1/chat/completions  same" in text
    assert "turn 2  chat  /v1/chat/completions  differs: finish_reason, content" in text
    assert "  ≠ finish_reason     stop                        length" in text
    assert "      -forty-two" in text and "      +41" in text and "       line one" in text
    assert text.endswith("2 turn(s) replayed, 1 differ")
