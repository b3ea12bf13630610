"""SQL scripts as the statements they hold, for running each inside a transaction of ours
(`executescript` would commit the open transaction first).

Owns: the split, by `sqlite3.complete_statement` (SQLite's own tokenizer), so a `;` inside a string
literal, a comment or a trigger's body does not end a statement. Does not own any script.

    for statement in statements("CREATE TABLE a (x); INSERT INTO a VALUES (';')"):
        conn.execute(statement)
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator


def statements(script: str) -> Iterator[str]:
    """The complete statements of `script`, in order; a trailing fragment that is not a complete
    statement is an error, not silently dropped.

    >>> list(statements("SELECT ';'; SELECT 2;"))
    ["SELECT ';';", ' SELECT 2;']
    """
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n\t;"):
                yield pending
            pending = ""
    if pending.removesuffix(";").strip():
        raise ValueError(f"the SQL script ends in an incomplete statement: {pending.removesuffix(';')!r}")
