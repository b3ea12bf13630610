"""Reading a loaded config's values the way OmegaConf resolves them: `${a.b}`, relative `${.b}` /
`${..b}` and `${oc.env:VAR[,default]}` interpolations, evaluated on demand against the environment the
trainer will have.

Owns: `Config` (read access with resolution) and `Unresolved` (a value that cannot be known here). Does
not own: loading the YAML, which keeps interpolations as written (compat/hydra.py), or what the values
mean (the rules).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from modeltap.compat.hydra import primitive

# OmegaConf's mark for a value that is still to be given.
_OMEGACONF_MISSING = "???"
_ABSENT = object()


class Unresolved(Exception):
    """A value the doctor cannot know here, such as `${oc.env:VAR}` with VAR unset."""

    def __init__(self, path: str, reason: str, needs: str | None = None) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
        self.needs = needs  # the environment variable it waits for, if that is what it is


_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


class Config:
    """Read access to a loaded config, resolving OmegaConf interpolations against `env` on the way.

    `get` returns `default` for a key that is absent (or OmegaConf's `???`) and raises `Unresolved`
    for one that cannot be evaluated here; `check` turns that into an `info` finding."""

    _MAX_DEPTH = 32  # interpolations following interpolations: deeper than this is a cycle

    def __init__(self, raw: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self._raw = raw
        self._env = env

    def has(self, path: str) -> bool:
        return self._node(path, 0) is not _ABSENT

    def get(self, path: str, default: Any = None) -> Any:
        node = self._node(path, 0)
        if node is _ABSENT or node == _OMEGACONF_MISSING:
            return default
        return self._resolve(node, path, 0)

    def size(self, path: str) -> int:
        """How many items the list (or keys the mapping) at `path` has, without resolving them."""
        node = self._follow(self._node(path, 0), path, 0)
        return len(node) if isinstance(node, list | dict) else 0

    def _node(self, path: str, depth: int) -> Any:
        node: Any = self._raw
        walked: list[str] = []
        for part in path.split("."):
            node = self._follow(node, ".".join(walked), depth)
            node = _child(node, part)
            if node is _ABSENT:
                return _ABSENT
            walked.append(part)
        return node

    def _follow(self, node: Any, path: str, depth: int) -> Any:
        """A node that is exactly `${other.path}` stands for that node."""
        while isinstance(node, str) and (match := _INTERPOLATION.fullmatch(node)):
            target = self._target(match[1], path)
            if target is None or depth > self._MAX_DEPTH:
                return node
            node, path, depth = self._node(target, depth + 1), target, depth + 1
        return node

    def _resolve(self, node: Any, path: str, depth: int) -> Any:
        if depth > self._MAX_DEPTH:
            raise Unresolved(path, "the interpolations form a cycle")
        if isinstance(node, dict):
            return {k: self._resolve(v, f"{path}.{k}", depth) for k, v in node.items()}
        if isinstance(node, list):
            return [self._resolve(v, f"{path}.{i}", depth) for i, v in enumerate(node)]
        if not isinstance(node, str) or "${" not in node:
            return node
        whole = _INTERPOLATION.fullmatch(node)
        if whole:
            return self._evaluate(whole[1], path, depth)
        if _INTERPOLATION.sub("", node).count("${"):
            raise Unresolved(path, f"{node!r} nests interpolations, which doctor does not evaluate")
        return _INTERPOLATION.sub(lambda m: str(self._evaluate(m[1], path, depth)), node)

    def _evaluate(self, expression: str, path: str, depth: int) -> Any:
        if expression.startswith("oc.env:"):
            name, comma, fallback = expression[len("oc.env:") :].partition(",")
            value = self._env.get(name.strip())
            if value is not None:
                return value
            if comma:
                return primitive(fallback.strip().strip("'\""))
            raise Unresolved(
                path, f"${{{expression}}} needs the environment variable {name.strip()}", name.strip()
            )
        target = self._target(expression, path)
        if target is None:
            raise Unresolved(path, f"${{{expression}}} uses a resolver doctor does not evaluate")
        node = self._node(target, depth + 1)
        if node is _ABSENT:
            raise Unresolved(path, f"${{{expression}}} points at {target}, which is not in the config")
        return self._resolve(node, target, depth + 1)

    @staticmethod
    def _target(expression: str, path: str) -> str | None:
        """The absolute path an interpolation refers to (`a.b`, or relative `.b`, `..b`), or None for a
        resolver call such as `oc.env:` or `now:`."""
        expression = expression.strip()
        if ":" in expression:
            return None
        dots = len(expression) - len(expression.lstrip("."))
        if not dots:
            return expression
        base = path.split(".")[:-dots] if path else []
        return ".".join([*base, expression[dots:]])


def _child(node: object, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part, _ABSENT)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return _ABSENT
