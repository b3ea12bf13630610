"""Tests for modeltap/compat/hydra.py: reading an experiment config with Hydra itself (hydra-core and
omegaconf are in the test extra, as they are in AReaL's environment) and with the fallback reader used
without them. Every case runs through both (the `reader` fixture), so the fallback is held to what
Hydra does. Resolving the interpolations they leave as written is the doctor's (test_doctor.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modeltap.compat.hydra import load_config

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "doctor"
BASE = "a:\n  b: 1\n  c: [1, 2]\n"


def without_hydra(monkeypatch: pytest.MonkeyPatch, module: str = "hydra") -> None:
    """Make `import hydra` (or omegaconf) fail, as it does where neither is installed."""
    monkeypatch.setitem(sys.modules, module, None)


@pytest.fixture(params=["hydra", "by hand"])
def reader(request, monkeypatch) -> str:
    if request.param == "by hand":
        without_hydra(monkeypatch)
    return request.param


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


def by_hand(monkeypatch: pytest.MonkeyPatch, path: str, overrides: list[str]) -> dict:
    with monkeypatch.context() as patched:
        without_hydra(patched)
        return load_config(path, overrides)


# --- which reader -------------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["hydra", "omegaconf"])
def test_the_fallback_reads_when_hydra_is_not_importable(tmp_path, monkeypatch, module):
    # A config-group default: Hydra composes it, the fallback reads config names only. So the answer
    # tells which of the two read the file.
    (tmp_path / "db").mkdir()
    write(tmp_path, "host: h\n", "db/mysql.yaml")
    config = write(tmp_path, "defaults: [{db: mysql}, _self_]\na: 1\n")
    assert load_config(config) == {"db": {"host": "h"}, "a": 1}
    without_hydra(monkeypatch, module)
    with pytest.raises(ValueError, match="defaults list of config names only"):
        load_config(config)


def test_hydra_is_imported_only_when_a_config_is_read():
    code = "import sys, modeltap.compat.doctor; print(sorted({'hydra', 'omegaconf'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_hydra_state_outlives_a_read(tmp_path):
    from hydra.core.global_hydra import GlobalHydra

    load_config(write(tmp_path, BASE), ["a.b=2"])
    assert not GlobalHydra.instance().is_initialized()
    with pytest.raises(ValueError):
        load_config(write(tmp_path, BASE), ["a.x=2"])
    assert not GlobalHydra.instance().is_initialized()


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.name)
def test_both_readers_read_every_doctor_fixture_alike(path, monkeypatch):
    with_hydra = load_config(str(path))
    assert with_hydra == by_hand(monkeypatch, str(path), [])
    assert with_hydra["workflow"]  # composed with clean.yaml, its defaults


# --- overrides ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("a.b=2", {"a": {"b": 2, "c": [1, 2]}}),
        ("a.b=-1.5", {"a": {"b": -1.5, "c": [1, 2]}}),
        ("a.b=1e-5", {"a": {"b": 1e-5, "c": [1, 2]}}),
        ("a.b=true", {"a": {"b": True, "c": [1, 2]}}),
        ("a.b=False", {"a": {"b": False, "c": [1, 2]}}),
        ("a.b=null", {"a": {"b": None, "c": [1, 2]}}),
        ("a.b=", {"a": {"b": "", "c": [1, 2]}}),
        ("a.b=hello world", {"a": {"b": "hello world", "c": [1, 2]}}),
        ("a.b='quoted, with comma'", {"a": {"b": "quoted, with comma", "c": [1, 2]}}),
        ('a.b="1"', {"a": {"b": "1", "c": [1, 2]}}),
        ('a.b="${a.c}"', {"a": {"b": "${a.c}", "c": [1, 2]}}),
        ("a.b=expandable_segments:True", {"a": {"b": "expandable_segments:True", "c": [1, 2]}}),
        ("a.b=${oc.env:X,y}", {"a": {"b": "${oc.env:X,y}", "c": [1, 2]}}),
        ("a.b=[1, x, [2.5]]", {"a": {"b": [1, "x", [2.5]], "c": [1, 2]}}),
        ("a.b={k: v, n: 1, d: {e: null}}", {"a": {"b": {"k": "v", "n": 1, "d": {"e": None}}, "c": [1, 2]}}),
        ("a.b={}", {"a": {"b": {}, "c": [1, 2]}}),
        ("a.c=[3]", {"a": {"b": 1, "c": [3]}}),
        ("a.c.1=9", {"a": {"b": 1, "c": [1, 9]}}),
        ("+a.d=3", {"a": {"b": 1, "c": [1, 2], "d": 3}}),
        ("+x.y.z=3", {"a": {"b": 1, "c": [1, 2]}, "x": {"y": {"z": 3}}}),
        ("+a.b.z=3", {"a": {"b": {"z": 3}, "c": [1, 2]}}),  # Hydra puts a mapping in the scalar's place
        ("++a.b=4", {"a": {"b": 4, "c": [1, 2]}}),
        ("++a.d=4", {"a": {"b": 1, "c": [1, 2], "d": 4}}),
        ("++a-b.$c=4", {"a": {"b": 1, "c": [1, 2]}, "a-b": {"$c": 4}}),  # Hydra's key characters
        ("~a.b", {"a": {"c": [1, 2]}}),
        ("~a.b=1", {"a": {"c": [1, 2]}}),
        ("hydra.job.name=x", {"a": {"b": 1, "c": [1, 2]}}),  # Hydra's own node, left out
    ],
)
def test_overrides(tmp_path, reader, override, expected):
    assert load_config(write(tmp_path, BASE), [override]) == expected


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("m.n={}", {"x": 1, "y": {"z": 1}}),  # a mapping merges into the one there: {} changes nothing
        ("++m.n={}", {"x": 1, "y": {"z": 1}}),
        ("m.n={y: {z: 2}}", {"x": 1, "y": {"z": 2}}),
        ("++m.n={k: v, y: {w: 2}}", {"x": 1, "y": {"z": 1, "w": 2}, "k": "v"}),
        ("m.n.y=3", {"x": 1, "y": 3}),
        ("m.n=null", None),
    ],
)
def test_a_mapping_given_to_a_mapping_merges_into_it(tmp_path, reader, override, expected):
    config = load_config(write(tmp_path, "m:\n  n: {x: 1, y: {z: 1}}\n"), [override])
    assert config == {"m": {"n": expected}}


def test_replacing_a_mapping_takes_a_delete_first(tmp_path, reader):
    config = load_config(write(tmp_path, "m:\n  n: {x: 1}\n"), ["~m.n", "++m.n={k: v}"])
    assert config == {"m": {"n": {"k": "v"}}}


BAD_OVERRIDES = [
    "a.x=1",
    "+a.b=1",
    "~a.x",
    "~a.b=2",
    "a.b=1,2",
    "a.c.5=1",
    "++a.c.5=1",
    "a.b.c=1",
    "a.b",
    "a-b=1",
    "a.b=[1, 2",
    "a.b='open",
    "~a.c.0",  # Hydra 1.4.0.dev1 cannot delete a list item: AReaL would fail on it
]


@pytest.mark.parametrize("override", BAD_OVERRIDES)
def test_a_bad_override_is_named(tmp_path, reader, override):
    with pytest.raises(ValueError) as error:
        load_config(write(tmp_path, BASE), ["++z=0", override, "++y=1"])
    assert str(error.value).startswith(f"override {override!r}: ")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("a.x=1", r"a\.x is not in the config; to add it use \+a\.x="),
        ("+a.b=1", r"a\.b is already in the config"),
        ("~a.x", r"could not delete a\.x"),
        ("~a.b=2", r"a\.b is 1, not 2"),
        ("a.b=1,2", r"Hydra sweep"),
        ("a.c.5=1", r"is not in the config"),
        ("++a.c.5=1", r"past the end of its list"),
        ("a.b.c=1", r"a\.b is not a mapping or list"),
        ("a.b", r"expected key=value"),
        ("a-b=1", r"a-b is not in the config"),
        ("a.b=[1, 2", r"expected ',' or ']'"),
        ("a.b='open", r"expected \"'\""),
        ("~a.c.0", r"Hydra cannot delete an item of a list"),
        ("a.m={k: v}", r"a\.m\.k is not in the config; to add it use \+\+a\.m=\{k: v\}"),
    ],
)
def test_the_fallback_says_what_is_wrong(tmp_path, monkeypatch, override, message):
    without_hydra(monkeypatch)
    with pytest.raises(ValueError, match=message):
        load_config(write(tmp_path, BASE + "  m: {}\n"), [override])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("a.x=1", "Could not override 'a.x'. To append to your config use +a.x=1 (Key 'x' is not in struct)"),
        ("~a.b=2", "Could not delete from config. The value of 'a.b' is 1 and not 2."),
        ("a.c.5=1", "Error merging override a.c.5=1 (list index out of range)"),
        ("~a.c.0", "Hydra failed with TypeError: list indices must be integers or slices, not str"),
    ],
)
def test_hydra_says_what_is_wrong_on_one_line(tmp_path, override, message):
    with pytest.raises(ValueError) as error:
        load_config(write(tmp_path, BASE), [override])
    assert str(error.value) == f"override {override!r}: {message}"


# --- files --------------------------------------------------------------------------------------


def test_yaml_reads_floats_as_omegaconf_does(tmp_path, reader):
    config = load_config(write(tmp_path, "eps: 1e-8\nlr: 1.70e-5\nn: 10\nv: 2.1.0\ns: '1e-8'\nt: 1_000\n"))
    assert config == {"eps": 1e-8, "lr": 1.7e-5, "n": 10, "v": "2.1.0", "s": "1e-8", "t": 1000}


@pytest.mark.parametrize(
    ("text", "by_hand", "with_hydra"),
    [
        ("a: 1\na: 2\n", "duplicate key 'a'", "found duplicate key a"),
        ("a: [\n", "not valid YAML", "not valid YAML"),
        ("- 1\n- 2\n", "the top level must be a mapping", "must be a DictConfig"),
        ("5\n", "the top level must be a mapping", "Invalid loaded object type: int"),
        ("defaults: base\n", "defaults list of config names only", "defaults must be a list"),
        ("defaults: [{db: mysql}]\n", "defaults list of config names only", "Could not find 'db/mysql'"),
        ("defaults: [c]\n", "includes itself", "includes itself"),
        ("defaults: [nowhere]\n", "nowhere.yaml: cannot read it", "Could not load 'nowhere'"),
    ],
)
def test_a_bad_file_is_named(tmp_path, reader, text, by_hand, with_hydra):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as error:
        load_config(path)
    assert str(error.value).startswith(f"{tmp_path}/")
    assert (with_hydra if reader == "hydra" else by_hand) in str(error.value)


def test_a_yaml_error_names_the_file_it_is_in(tmp_path, reader):
    write(tmp_path, "a: [\n", "base.yaml")
    with pytest.raises(ValueError) as error:
        load_config(write(tmp_path, "defaults: [base]\nd: own\n"))
    assert str(error.value).startswith(f"{tmp_path / 'base.yaml'}: not valid YAML")


def test_only_yaml_files_are_configs(tmp_path, reader):
    with pytest.raises(
        ValueError, match=r"c\.yml: Hydra, and so AReaL, reads only config files named \*\.yaml"
    ):
        load_config(write(tmp_path, BASE, "c.yml"))


def test_missing_file(tmp_path, reader):
    with pytest.raises(ValueError, match=f"^{tmp_path / 'nope.yaml'}: cannot read it"):
        load_config(str(tmp_path / "nope.yaml"))


def test_defaults_compose_like_hydra(tmp_path, reader):
    write(tmp_path, "a: {b: 1, c: [1, 2]}\nd: base\n", "base.yaml")
    assert load_config(write(tmp_path, "defaults: [base]\na: {c: [3]}\n")) == {
        "a": {"b": 1, "c": [3]},
        "d": "base",
    }
    # _self_ first: the included config wins
    assert load_config(write(tmp_path, "defaults: [_self_, base]\nd: own\n")) == {
        "a": {"b": 1, "c": [1, 2]},
        "d": "base",
    }


def test_overrides_apply_after_the_defaults(tmp_path, reader):
    write(tmp_path, "a: {b: 1, c: [1, 2]}\n", "base.yaml")
    config = write(tmp_path, "defaults: [base, _self_]\na: {b: 2}\n")
    assert load_config(config, ["a.b=3", "+a.d=4"]) == {"a": {"b": 3, "c": [1, 2], "d": 4}}


# --- interpolations -----------------------------------------------------------------------------


def test_interpolations_stay_as_written(tmp_path, reader):
    text = 'a: {b: 4, c: "${a.b}", d: "x-${oc.env:NAME,y}"}\nh: ${a.c}\n'
    assert load_config(write(tmp_path, text), ["++e=${.h}"]) == {
        "a": {"b": 4, "c": "${a.b}", "d": "x-${oc.env:NAME,y}"},
        "h": "${a.c}",
        "e": "${.h}",
    }
