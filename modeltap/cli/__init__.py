"""The `modeltap` command: parses arguments and calls the library (main.py), and writes shell completion
scripts from the same parser (completion.py)."""

from modeltap.cli.main import main

__all__ = ["main"]
