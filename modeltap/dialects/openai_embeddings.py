"""OpenAI embeddings: `POST /v1/embeddings`. Relayed and recorded; nothing is generated, so it has no
budget and no stream, and its usage (`prompt_tokens`) is all a summary reads."""

from __future__ import annotations

from modeltap.dialects.roles import ROLES, GeneratesNothing, OpenAIShaped


class Embeddings(OpenAIShaped, GeneratesNothing, declines=ROLES):
    name = "embeddings"
    route = "embeddings"
    operation = "embeddings"


DIALECT = Embeddings()
