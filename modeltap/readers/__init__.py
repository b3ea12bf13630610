"""The readers a user runs on the records, one module per command: sessions and groups (sessions.py),
show, diff, grep, stats, tail, serve's line per exchange (console.py) and the web viewer (ui/)."""
