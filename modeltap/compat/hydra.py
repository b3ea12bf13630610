"""Reading an AReaL experiment config the way AReaL does: with Hydra and OmegaConf when they are
installed (they are in AReaL's environment), else with a reader written after them.

Owns: composing the YAML with its `defaults` list and Hydra command-line overrides (`a.b=c`, `+a.b=c`,
`++a.b=c`, `~a.b`, list indices), by Hydra itself or by the fallback reader, and errors that name the
file or the override at fault. Interpolations (`${a.b}`, `${oc.env:VAR}`) stay as written. Does not
own: resolving them against an environment (the doctor's `Config`, doctor/config.py), or what the
values mean (the doctor's rules).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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
    """Read the experiment YAML at `path` and apply Hydra `overrides` in order, as AReaL's launcher does.

    `a.b=c` changes an existing key, `+a.b=c` adds a new one, `++a.b=c` adds or changes, `~a.b` (or
    `~a.b=c`, only if it is c) deletes; values are read as Hydra reads them (`null`, `true`, `42`,
    `1e-5`, `[a, b]`, `{k: v}`, quoted strings), and a mapping given to a mapping merges into it (so
    replacing one takes `~key ++key={...}`). A `defaults: [base, _self_]` list composes configs of the
    same folder first (`_self_` last unless placed). Interpolations stay as written; the doctor's
    `Config` resolves them. Raises ValueError naming the file or the override at fault.

    Hydra composes it when hydra-core and omegaconf are importable; otherwise `_load_by_hand` does, for
    `defaults` lists of config names only.

        config = load_config("grpo.yaml", ["++rollout.agent.engine_max_tokens=32762"])
    """
    if not path.endswith(".yaml"):
        raise ValueError(f"{path}: Hydra, and so AReaL, reads only config files named *.yaml")
    try:
        import hydra  # noqa: F401  (imported here: it costs a tenth of a second, and is optional)
        import omegaconf  # noqa: F401
    except ImportError:
        return _load_by_hand(Path(path), overrides)
    return _load_with_hydra(Path(path), list(overrides))


def _load_with_hydra(path: Path, overrides: list[str]) -> dict[str, Any]:
    _check_readable(path)
    try:
        return _compose(path, overrides)
    except _hydra_failures() as exc:
        raise _at_fault(path, overrides, exc) from exc


def _compose(path: Path, overrides: list[str]) -> dict[str, Any]:
    """Hydra's composition, with interpolations left as written. GlobalHydra is cleared before, as AReaL
    does, and after, so that no Hydra state outlives the call."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with warnings.catch_warnings():
            # "Defaults list is missing `_self_`": Hydra then composes the file last, as AReaL gets it.
            warnings.simplefilter("ignore", UserWarning)
            # version_base=None: what AReaL's launcher passes (load_expr_config in areal/api/cli_args.py)
            with initialize_config_dir(config_dir=str(path.resolve().parent), version_base=None):
                composed = compose(config_name=path.name.removesuffix(".yaml"), overrides=overrides)
        config = OmegaConf.to_container(composed, resolve=False)
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(config, dict)  # compose refuses a primary config that is not a mapping
    return {str(key): value for key, value in config.items()}


def _hydra_failures() -> tuple[type[BaseException], ...]:
    """What Hydra raises for a bad config or override: its own and OmegaConf's errors, YAML errors, and
    builtins from inside it (OSError for a scalar at the top, RecursionError for a config that includes
    itself, TypeError for `~list.0`, ValueError for a defaults list that is not a list)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    return (
        HydraException,
        OmegaConfBaseException,
        yaml.YAMLError,
        OSError,
        RecursionError,
        TypeError,
        ValueError,
        KeyError,
        IndexError,
    )


def _at_fault(path: Path, overrides: list[str], exc: BaseException) -> ValueError:
    """A ValueError naming what failed: the first override whose addition breaks the composition, else
    the file (for a YAML error, the file of the defaults list it is in)."""
    if overrides and _failure(path, []) is None:
        for count in range(1, len(overrides) + 1):
            failure = _failure(path, overrides[:count])
            if failure is not None:
                return ValueError(f"override {overrides[count - 1]!r}: {_message(failure)}")
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        return ValueError(f"{exc.problem_mark.name}: not valid YAML: {exc}")
    if isinstance(exc, RecursionError):
        return ValueError(f"{path}: its defaults list includes itself, directly or through another config")
    return ValueError(f"{path}: {_message(exc)}")


def _failure(path: Path, overrides: list[str]) -> BaseException | None:
    try:
        _compose(path, overrides)
    except _hydra_failures() as exc:
        return exc
    return None


def _message(exc: BaseException) -> str:
    """Hydra's message without its search-path listing and its link, with the cause it wraps."""
    text = str(exc).split("\n\n")[0].split("\nSee https://hydra.cc")[0]
    text = " ".join(line.strip() for line in text.splitlines())
    if isinstance(exc, TypeError | KeyError | IndexError):  # a Hydra bug rather than a message
        text = f"Hydra failed with {type(exc).__name__}: {text}"
    cause = str(exc.__cause__ or "").strip()
    return f"{text} ({cause.splitlines()[0]})" if cause else text


def _check_readable(path: Path) -> None:
    try:
        path.open("rb").close()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it: {exc.strerror}") from exc


def _load_by_hand(path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """The fallback reader: Hydra's composition and overrides, written after them."""
    config = _read_composed(path, ())
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


# Hydra's key grammar: dot-separated keys or list indices (KEY_SPECIAL, INT_UNSIGNED and DOT_PATH in
# https://github.com/facebookresearch/hydra/blob/main/hydra/grammar/OverrideLexer.g4).
_KEY_PART = r"(?:[A-Za-z_$][A-Za-z0-9_$-]*|0|[1-9][0-9]*)"
_OVERRIDE = re.compile(rf"(?P<op>~|\+\+|\+)?(?P<key>{_KEY_PART}(?:\.{_KEY_PART})*)(?:=(?P<value>.*))?", re.S)


def _apply_override(config: dict[str, Any], text: str) -> None:
    match = _OVERRIDE.fullmatch(text.strip())
    if match is None or (match["value"] is None and match["op"] != "~"):
        raise ValueError(f"override {text!r}: expected key=value, +key=value, ++key=value or ~key")
    op, key = match["op"] or "", match["key"]
    value = None if match["value"] is None else _parse_value(match["value"], text)
    if key.split(".")[0] == "hydra":
        return  # Hydra's own settings: they go to its `hydra` node, which the composed config leaves out
    *parents, leaf = key.split(".")
    node: Any = config
    for depth, part in enumerate(parents):
        child = _child(node, part)
        if not isinstance(child, dict | list) and op in ("+", "++") and isinstance(node, dict):
            child = node[part] = {}  # Hydra's merge puts a mapping where there was none, or a scalar
        if not isinstance(child, dict | list):
            where = ".".join(parents[: depth + 1])
            raise ValueError(f"override {text!r}: {where} is not a mapping or list in the config")
        node = child
    current = _child(node, leaf)
    if op == "~":
        _delete(node, leaf, current, value if match["value"] is not None else _ABSENT, text)
    elif op == "" and current is _ABSENT:
        raise ValueError(
            f"override {text!r}: {key} is not in the config; to add it use +{key}=... (or ++{key}=...)"
        )
    elif op == "+" and current is not _ABSENT:
        raise ValueError(f"override {text!r}: {key} is already in the config; to change it use {key}=...")
    elif isinstance(node, list) and current is _ABSENT:
        raise ValueError(f"override {text!r}: {key} is past the end of its list")
    else:
        node[int(leaf) if isinstance(node, list) else leaf] = _assigned(current, value, op, text)


def _assigned(current: Any, value: Any, op: str, text: str) -> Any:
    """What `key=value` leaves at the key: Hydra merges a mapping into the mapping already there (so
    `key={}` changes nothing), and without `++` the mapping may not bring keys the config lacks."""
    if not (isinstance(current, dict) and isinstance(value, dict)):
        return value
    new = _new_keys(current, value)
    if op == "" and new:
        key = text.strip().partition("=")[0]
        raise ValueError(
            f"override {text!r}: {key}.{new} is not in the config; to add it use ++{text.strip()}"
        )
    return _merged(current, value)


def _new_keys(base: Mapping[str, Any], update: Mapping[str, Any]) -> str | None:
    """The first key path of `update` that `base` lacks, or None."""
    for key, value in update.items():
        if key not in base:
            return str(key)
        inner = (
            _new_keys(base[key], value) if isinstance(base[key], dict) and isinstance(value, dict) else None
        )
        if inner is not None:
            return f"{key}.{inner}"
    return None


def _delete(node: dict[str, Any] | list[Any], leaf: str, current: Any, expected: Any, text: str) -> None:
    """`~key` (`expected` is _ABSENT) or `~key=value`."""
    key = text.strip().lstrip("~").partition("=")[0]
    if isinstance(node, list):  # Hydra 1.4.0.dev1 fails on it with a TypeError
        raise ValueError(f"override {text!r}: Hydra cannot delete an item of a list")
    if current is _ABSENT:
        raise ValueError(f"override {text!r}: could not delete {key}, it is not in the config")
    if expected is not _ABSENT and current != expected:
        raise ValueError(f"override {text!r}: {key} is {current!r}, not {expected!r}")
    del node[leaf]


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
    try:
        value = parser.value(stop=",")
    except ValueError as exc:
        raise ValueError(f"override {override!r}: {exc}") from None
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
    """A token as Hydra reads an unquoted value: null, a bool, an int, a float, else the string."""
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
