"""Shared by every tier."""

import os

# modeltap uses transformers for tokenizers only; its "PyTorch was not found" advice is noise here.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

pytest_plugins = ["tests.standins.fixtures"]
