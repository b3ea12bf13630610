"""Several records databases read as one set of sessions: the files of many nodes, named by `--store`
given more than once, by globs, or by `MODELTAP_STORE` holding a list.

Owns: turning what the user gave into database paths (each glob expanded, each file once), the
store the last `modeltap serve` wrote to (a one-line state file) for a reader given none, a reader
for each, finding a session by the first characters of its id across them, and listing and grouping
across them. A session id found in two stores is two sessions: each row says which store it is from.
Does not own: reading one store (reader.py), the filters and merging (query.py), printing (modeltap/readers).

    with Stores.open(["nodes/*/records.db"]) as stores:
        rows = stores.sessions(SessionQuery(limit=50))      # newest first, each with its "store"
        reader, session_id = stores.resolve("s-3f")
"""

from __future__ import annotations

import dataclasses
import difflib
import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from modeltap.records.query import SessionQuery, merge_groups
from modeltap.records.reader import StoreReader, StoreUnreadable

# How many matches of an id prefix an ambiguity message names.
AMBIGUOUS_SHOWN = 10
# How many ids a "no such session" message offers: the closest, or else the newest.
SUGGESTED = 5
# Where `modeltap serve` leaves the absolute path of its store, under the XDG state directory (state
# that persists between runs but is not worth backing up:
# https://specifications.freedesktop.org/basedir-spec/latest/), so a reader started elsewhere finds it.
LAST_STORE_FILE = Path("modeltap") / "last-store"
_GLOB_CHARS = frozenset("*?[")


def patterns_from(flags: Sequence[str] | None, env: Mapping[str, str], default: str) -> list[str]:
    """What names the stores: the `--store` flags, else `MODELTAP_STORE` (paths or globs separated by
    the OS path separator, `:` on Linux, as in PATH), else `default`."""
    if flags:
        return list(flags)
    listed = [part for part in env.get("MODELTAP_STORE", "").split(os.pathsep) if part]
    return listed or [default]


def reader_patterns(
    flags: Sequence[str] | None, env: Mapping[str, str], default: str
) -> tuple[list[str], Path | None]:
    """What names the stores a reader reads (`patterns_from`), and, when nothing named one and
    `default` is not here, the store the last `modeltap serve` wrote to instead: (its path as the one
    pattern, that path), so the reader can say it is reading it. Else (patterns, None)."""
    patterns = patterns_from(flags, env, default)
    if flags or env.get("MODELTAP_STORE") or Path(default).exists():
        return patterns, None
    last = last_store(env)
    return ([str(last)], last) if last is not None else (patterns, None)


def last_store_file(env: Mapping[str, str]) -> Path:
    """`$XDG_STATE_HOME/modeltap/last-store`, or `~/.local/state/modeltap/last-store`."""
    state = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / LAST_STORE_FILE


def remember_store(path: Path | str, env: Mapping[str, str]) -> Path:
    """Write `path`, made absolute, as the store the last `modeltap serve` wrote to; returns the state
    file. Replaced whole (a temporary file renamed), so a reader never sees half a path."""
    state = last_store_file(env)
    state.parent.mkdir(parents=True, exist_ok=True)
    partial = state.with_name(f"{state.name}.{os.getpid()}")
    partial.write_text(str(Path(path).resolve()) + "\n", encoding="utf-8")
    partial.replace(state)
    return state


def last_store(env: Mapping[str, str]) -> Path | None:
    """The store the last `modeltap serve` wrote to, if it said and the file is still there."""
    try:
        text = last_store_file(env).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    path = Path(text)
    return path if text and path.is_absolute() and path.exists() else None


def expand(patterns: Sequence[str], *, missing_ok: bool = False) -> list[Path]:
    """The database paths `patterns` name, in order, each once. A glob that matches nothing is an
    error (with `missing_ok`, it stands for itself, a file that does not exist yet); a plain path is
    kept as it is (a reader says when it does not exist)."""
    paths: dict[Path, Path] = {}
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if _GLOB_CHARS.isdisjoint(pattern):
            found = [pattern]
        else:
            found = sorted(glob.glob(pattern)) or ([pattern] if missing_ok else [])
            if not found:
                raise FileNotFoundError(
                    f"no records database matches {pattern!r} (give --store PATH or set MODELTAP_STORE)"
                )
        for path in map(Path, found):
            paths.setdefault(path.resolve(), path)
    return list(paths.values())


class Stores:
    """Readers of several records databases, as one set of sessions. `several` says whether rows
    need their store named; `missing` lists paths that do not exist (yet) when opened with
    `missing_ok`; `refused` the stores skipped among several, each with the one line saying why."""

    def __init__(
        self, readers: Sequence[StoreReader], missing: Sequence[Path] = (), refused: Sequence[str] = ()
    ) -> None:
        self.readers = list(readers)
        self.missing = list(missing)
        self.refused = list(refused)

    @classmethod
    def open(cls, patterns: Sequence[str], *, missing_ok: bool = False) -> Stores:
        """Readers of what `patterns` name (see `expand`). Without `missing_ok`, a path that does not
        exist raises FileNotFoundError, as StoreReader does. A store a reader refuses (StoreUnreadable:
        not a records database, damaged, not modeltap's) raises when it is the only one; among several
        it is skipped, and `refused` says so, so one bad file of a glob over nodes hides no other."""
        readers: list[StoreReader] = []
        missing: list[Path] = []
        refused: list[str] = []
        try:
            paths = expand(patterns, missing_ok=missing_ok)
            for path in paths:
                if missing_ok and not path.exists():
                    missing.append(path)
                    continue
                try:
                    readers.append(StoreReader(path))
                except StoreUnreadable as exc:
                    if len(paths) == 1:
                        raise
                    refused.append(f"skipped: {exc}")
            if paths and not readers and not missing:
                raise StoreUnreadable("; ".join(refused))
        except BaseException:
            for reader in readers:
                reader.close()
            raise
        return cls(readers, missing, refused)

    def interrupt(self) -> None:
        """Stop every statement running on these readers (from another thread)."""
        for reader in self.readers:
            reader.interrupt()

    def close(self) -> None:
        for reader in self.readers:
            reader.close()

    def __enter__(self) -> Stores:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def several(self) -> bool:
        return len(self.readers) + len(self.missing) > 1

    def sessions(
        self, query: SessionQuery, revisions: Sequence[int | None] | None = None
    ) -> list[dict[str, Any]]:
        """The sessions `query` selects in every store, merged in its order, each with its `store`.
        `revisions` gives each store its own `changed_after` (revisions are per store)."""
        answers = []
        for index, reader in enumerate(self.readers):
            asked = query
            if revisions is not None:
                asked = dataclasses.replace(query, changed_after=revisions[index])
            answers.append([row | {"store": str(reader.path)} for row in reader.sessions(asked)])
        return query.merge(answers)

    def count(self, query: SessionQuery) -> int:
        """How many sessions `query` selects in every store, its limit aside."""
        return sum(reader.count(query) for reader in self.readers)

    def selected(self, query: SessionQuery) -> list[tuple[StoreReader, dict[str, Any]]]:
        """The sessions `query` selects (as `sessions` gives them), each with the reader of its store,
        for a command that goes on to read their exchanges."""
        readers = {str(reader.path): reader for reader in self.readers}
        return [(readers[row["store"]], row) for row in self.sessions(query)]

    def groups(self, label: str) -> list[dict[str, Any]]:
        """The groups of `label` over every store (query.merge_groups)."""
        return merge_groups(reader.groups(label) for reader in self.readers)

    def resolve(self, prefix: str) -> tuple[StoreReader, str]:
        """The store and the id of the session `prefix` names: an exact id, or the first characters
        of exactly one, in exactly one store."""
        matches = [
            (reader, session_id)
            for reader in self.readers
            for session_id in reader.session_ids(prefix, limit=AMBIGUOUS_SHOWN + 1)
        ]
        exact = [match for match in matches if match[1] == prefix]
        if len(exact) == 1:
            return exact[0]
        if len(matches) == 1:
            return matches[0]
        same = exact or (matches if len({sid for _, sid in matches}) == 1 else [])
        if same:
            where = ", ".join(str(reader.path) for reader, _ in same)
            raise ValueError(
                f"session {same[0][1]} is in {len(same)} stores ({where}); name one with --store"
            )
        if not matches:
            raise ValueError(self._missing(prefix))
        found = ", ".join(self._named(reader, sid) for reader, sid in matches[:AMBIGUOUS_SHOWN])
        count = str(len(matches)) if len(matches) <= AMBIGUOUS_SHOWN else f"more than {AMBIGUOUS_SHOWN}"
        raise ValueError(f"{prefix!r} names {count} sessions ({found}); give more of the id")

    def _missing(self, prefix: str) -> str:
        """What to say of an id no session has: the ids closest to it, or else the newest few. Every id
        is compared (difflib), which on this error path costs about a second per 100k sessions."""
        where = ", ".join(str(reader.path) for reader in self.readers)
        ids = sorted({sid for reader in self.readers for sid in reader.session_ids("")})
        if not ids:
            return f"no session {prefix!r}: {where} holds no sessions yet"
        close = difflib.get_close_matches(prefix, ids, n=SUGGESTED)
        if not close:  # the first characters of an id, mistyped: compare them with ids' as long
            starts: dict[str, list[str]] = {}
            for sid in ids:
                starts.setdefault(sid[: len(prefix)], []).append(sid)
            near = difflib.get_close_matches(prefix, starts, n=SUGGESTED)
            close = [sid for start in near for sid in starts[start]][:SUGGESTED]
        if close:
            return f"no session {prefix!r} in {where}; the closest: {', '.join(close)}"
        newest = [row["id"] for row in self.sessions(SessionQuery(limit=SUGGESTED))]
        listed = ", ".join(dict.fromkeys(newest))
        return f"no session {prefix!r} in {where}; the newest: {listed} (modeltap sessions lists more)"

    def _named(self, reader: StoreReader, session_id: str) -> str:
        return f"{session_id} in {reader.path}" if self.several else session_id
