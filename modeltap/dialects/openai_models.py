"""OpenAI and Anthropic model lists: `GET /v1/models` and `GET /v1/models/{id}`.

Owns: the route (with its item form) and the answer modeltap gives itself when the upstream serves no
model list (AReaL has none: docs/areal.md §1.1.1), from `serve --model`. One body satisfies both SDKs:
OpenAI's `{"object": "list", "data": [...]}` and Anthropic's `{"data": [...], "has_more", "first_id",
"last_id"}` (docs/agents.md §2.4).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from modeltap.dialects.roles import ROLES, GeneratesNothing, OpenAIShaped


class Models(OpenAIShaped, GeneratesNothing, declines=ROLES):
    name = "models"
    route = "models"
    method = "GET"
    item_route = True

    def local_answer(self, served_models: Sequence[str], started: float, item: str | None) -> Any:
        """The list of `served_models`, or the card of `item`; None when `item` is not among them."""
        cards = [_card(name, started) for name in served_models]
        if item is not None:
            return next((card for card in cards if card["id"] == item), None)
        first, last = (cards[0]["id"], cards[-1]["id"]) if cards else (None, None)
        return {"object": "list", "data": cards, "has_more": False, "first_id": first, "last_id": last}


def _card(name: str, started: float) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "type": "model",
        "display_name": name,
        "created": int(started),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "owned_by": "modeltap",
    }


DIALECT = Models()
