"""modeltap.compat imports nothing else of modeltap, and never AReaL (compat/areal.py reads AReaL's
metadata instead)."""

from __future__ import annotations

import ast
import subprocess
import sys

MODULES = [
    "modeltap.compat.areal",
    "modeltap.compat.clients",
    "modeltap.compat.doctor",
    "modeltap.compat.hydra",
    "modeltap.compat.layouts",
    "modeltap.compat.preparations",
    "modeltap.compat.prompts",
]


def test_compat_imports_only_itself_stdlib_and_yaml():
    # A fresh interpreter: the test process has long since imported the rest of modeltap.
    watched = ("modeltap", "areal", "aiohttp", "transformers", "tiktoken", "docker")
    listing = f"sorted(m for m in sys.modules if m.startswith({watched!r}))"
    code = f"import sys\nimport {', '.join(MODULES)}\nprint({listing})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # The doctor's rule modules come with it; nothing else of modeltap does.
    loaded = [m for m in ast.literal_eval(out) if not m.startswith("modeltap.compat.doctor.")]
    assert loaded == sorted(["modeltap", "modeltap.compat", *MODULES])
