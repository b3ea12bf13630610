"""The relay: an aiohttp reverse proxy that routes, names sessions, budgets tokens (through
modeltap.counting), translates formats an upstream lacks, and hands every exchange to its observers
(the record store first). `server.py` wires it; `relay.py` is one exchange."""
