"""Reading an AReaL experiment config the way AReaL's Hydra and OmegaConf do, without either.

Owns: YAML loading with OmegaConf's scalars, `defaults: [base]` composition, Hydra command-line
overrides (`a.b=c`, `+a.b=c`, `++a.b=c`, `~a.b`, list indices) and `${a.b}` / `${.rel}` /
`${oc.env:VAR[,default]}` interpolations resolved on demand (`Config`). Does not own: what the values
mean (doctor.py's rules).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

_OMEGACONF_MISSING = "???"
_ABSENT = object()


class _YamlLoader(yaml.SafeLoader):
    """YAML as OmegaConf reads it: `1e-5` is a float (YAML 1.1 reads a string) and a duplicate key is an
    error instead of a silent overwrite."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        duplicates = sorted({str(k) for k in keys if keys.count(k) > 1})
        if duplicates:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {duplicates[0]!r}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*)?(?:\.\d[\d_]*)?[eE][-+]?\d+$|^[-+]?\d[\d_]*\.[\d_]*$"),
    list("-+0123456789."),
)


def load_config(path: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Read the experiment YAML at `path` and apply Hydra-style `overrides` in order.

    `a.b=c` changes an existing key, `+a.b=c` adds a new one, `++a.b=c` adds or changes, `~a.b` (or
    `~a.b=c`, only if it is c) deletes; values are read as Hydra reads them (`null`, `true`, `42`,
    `1e-5`, `[a, b]`, `{k: v}`, quoted strings). A `defaults: [base, _self_]` list composes configs of
    the same folder first, as Hydra does (`_self_` last unless placed). Interpolations stay as
    written; `check` resolves them. Raises ValueError with the file or the override at fault.

        config = load_config("grpo.yaml", ["++rollout.agent.engine_max_tokens=32762"])
    """
    config = _read_composed(Path(path), ())
    for override in overrides:
        _apply_override(config, override)
    return config


def _read_composed(path: Path, reading: tuple[Path, ...]) -> dict[str, Any]:
    if path.resolve() in reading:
        raise ValueError(f"{path}: its defaults list includes itself")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror}") from exc
    try:
        doc = yaml.load(text, Loader=_YamlLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    own = {} if doc is None else doc
    if not isinstance(own, dict):
        raise ValueError(f"{path}: the top level must be a mapping of keys, not a {type(own).__name__}")
    defaults = own.pop("defaults", [])
    if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
        raise ValueError(f"{path}: doctor reads a defaults list of config names only, such as [base, _self_]")
    composed: dict[str, Any] = {}
    for name in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        part = (
            own
            if name == "_self_"
            else _read_composed(path.with_name(f"{name}.yaml"), (*reading, path.resolve()))
        )
        composed = _merged(composed, part)
    return composed


def _merged(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """OmegaConf's merge: mappings merge key by key, anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        out[key] = _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
    return out


# Hydra's key grammar: dot-separated IDs or list indices (hydra/grammar/OverrideLexer.g4, DOT_PATH).
_KEY_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|0|[1-9][0-9]*)"
_OVERRIDE = re.compile(rf"(?P<op>~|\+\+|\+)?(?P<key>{_KEY_PART}(?:\.{_KEY_PART})*)(?:=(?P<value>.*))?", re.S)


def _apply_override(config: dict[str, Any], text: str) -> None:
    match = _OVERRIDE.fullmatch(text.strip())
    if match is None or (match["value"] is None and match["op"] != "~"):
        raise ValueError(f"override {text!r}: expected key=value, +key=value, ++key=value or ~key")
    op, key = match["op"] or "", match["key"]
    value = None if match["value"] is None else _parse_value(match["value"], text)
    *parents, leaf = key.split(".")
    node: Any = config
    for depth, part in enumerate(parents):
        child = _child(node, part)
        if child is _ABSENT and op in ("+", "++") and isinstance(node, dict):
            child = node[part] = {}
        if not isinstance(child, dict | list):
            where = ".".join(parents[: depth + 1])
            raise ValueError(f"override {text!r}: {where} is not a mapping or list in the config")
        node = child
    current = _child(node, leaf)
    if op == "~":
        if current is _ABSENT:
            raise ValueError(f"override {text!r}: could not delete {key}, it is not in the config")
        if match["value"] is not None and current != value:
            raise ValueError(f"override {text!r}: {key} is {current!r}, not {value!r}")
        del node[int(leaf) if isinstance(node, list) else leaf]
    elif op == "" and current is _ABSENT:
        raise ValueError(
            f"override {text!r}: {key} is not in the config; to add it use +{key}=... (or ++{key}=...)"
        )
    elif op == "+" and current is not _ABSENT:
        raise ValueError(f"override {text!r}: {key} is already in the config; to change it use {key}=...")
    elif isinstance(node, list):
        if current is _ABSENT:
            raise ValueError(f"override {text!r}: {key} is past the end of its list")
        node[int(leaf)] = value
    else:
        node[leaf] = value


def _child(node: object, part: str) -> Any:
    if isinstance(node, dict):
        return node.get(part, _ABSENT)
    if isinstance(node, list) and part.isdigit() and int(part) < len(node):
        return node[int(part)]
    return _ABSENT


_INT = re.compile(r"[+-]?(?:0|[1-9][\d_]*)")
_FLOAT = re.compile(
    r"[+-]?(?:\d[\d_]*\.[\d_]*|\.\d[\d_]*|\d[\d_]*(?=[eE]))(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.I
)


def _parse_value(text: str, override: str) -> Any:
    """A Hydra override value: a primitive, a quoted string, or a `[...]` / `{...}` of values."""
    parser = _ValueParser(text)
    value = parser.value(stop=",")
    parser.skip_space()
    if parser.pos != len(text):
        raise ValueError(
            f"override {override!r}: cannot read the value at {text[parser.pos :]!r}"
            " (a,b is a Hydra sweep: doctor checks one configuration)"
        )
    return value


@dataclass
class _ValueParser:
    text: str
    pos: int = 0

    def skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def value(self, stop: str) -> Any:
        self.skip_space()
        opener = self.text[self.pos : self.pos + 1]
        if opener in ("[", "{"):
            return self._container(opener)
        if opener and opener in "'\"":
            return self._quoted(opener)
        return primitive(self._token(stop))

    def _container(self, opener: str) -> list[Any] | dict[str, Any]:
        closer = "]" if opener == "[" else "}"
        items: list[Any] = []
        pairs: dict[str, Any] = {}
        self.pos += 1
        self.skip_space()
        while not self.text.startswith(closer, self.pos):
            if opener == "[":
                items.append(self.value(stop=",]"))
            else:
                key = self._token(stop=":")
                self._expect(":")
                pairs[key] = self.value(stop=",}")
            self.skip_space()
            if self.text.startswith(",", self.pos):
                self.pos += 1
            elif not self.text.startswith(closer, self.pos):
                raise ValueError(f"expected ',' or {closer!r} at {self.text[self.pos :]!r}")
            self.skip_space()
        self.pos += 1
        return items if opener == "[" else pairs

    def _quoted(self, quote: str) -> str:
        out = []
        self.pos += 1
        while self.pos < len(self.text) and self.text[self.pos] != quote:
            if self.text[self.pos] == "\\" and self.pos + 1 < len(self.text):
                self.pos += 1
            out.append(self.text[self.pos])
            self.pos += 1
        self._expect(quote)
        return "".join(out)

    def _token(self, stop: str) -> str:
        """Text up to the next stop character, keeping `${...}` (which may hold any of them) whole."""
        start, depth = self.pos, 0
        while self.pos < len(self.text):
            if self.text.startswith("${", self.pos):
                depth, self.pos = depth + 1, self.pos + 2
                continue
            char = self.text[self.pos]
            if depth and char == "}":
                depth -= 1
            elif not depth and char in stop:
                break
            self.pos += 1
        return self.text[start : self.pos].strip()

    def _expect(self, char: str) -> None:
        if not self.text.startswith(char, self.pos):
            raise ValueError(f"expected {char!r} at {self.text[self.pos :]!r}")
        self.pos += 1


def primitive(token: str) -> Any:
    lowered = token.lower()
    if lowered == "null":
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    if _INT.fullmatch(token):
        return int(token)
    if _FLOAT.fullmatch(token):
        return float(token.replace("_", ""))
    return token


# --- Reading: interpolations resolved on demand ---------------------------------------------------


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
