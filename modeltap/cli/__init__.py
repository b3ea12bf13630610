"""The `modeltap` command: parses arguments and calls the library (commands.py), and writes shell completion
scripts from the same parser (completion.py)."""

from modeltap.cli.commands import main

__all__ = ["main"]
