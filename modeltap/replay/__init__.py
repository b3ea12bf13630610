"""Playing recordings again: `modeltap replay` re-sends a session to an upstream and compares the
answers (replay.py); `modeltap mock` answers as the upstream did, from the record (mock.py)."""
