"""modeltap/records/sql.py: a script split where SQLite's own tokenizer says a statement ends."""

from __future__ import annotations

import sqlite3

import pytest

from modeltap.records.sql import statements


def test_a_semicolon_in_a_string_a_comment_or_a_trigger_body_does_not_end_a_statement() -> None:
    script = """
        CREATE TABLE t (x TEXT);  -- a comment; with a semicolon
        INSERT INTO t VALUES ('a;b');
        CREATE TRIGGER copy AFTER INSERT ON t BEGIN
            INSERT INTO log VALUES (new.x); INSERT INTO log VALUES (';');
        END;
    """
    found = list(statements(script))
    assert len(found) == 3 and found[1].endswith("INSERT INTO t VALUES ('a;b');")
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE log (x TEXT)")
    for statement in found:
        conn.execute(statement)
    conn.execute("INSERT INTO t VALUES ('c')")
    assert [row[0] for row in conn.execute("SELECT x FROM log")] == ["c", ";"]


def test_an_incomplete_statement_at_the_end_is_an_error_and_blank_ones_are_skipped() -> None:
    assert list(statements(";;  \n;")) == []
    with pytest.raises(ValueError, match="incomplete statement"):
        list(statements("SELECT 1; SELECT 'unterminated"))
