"""The mechanism: an aiohttp reverse proxy that normalises paths, budgets tokens, tags sessions and
records every exchange. `server.py` wires it; `relay.py` is one exchange."""
