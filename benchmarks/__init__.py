"""modeltap's benchmarks: overhead and scale side by side with the peers (``make bench``), token counting.

Each module here is run with ``python -m benchmarks.<name>`` from the repository root, in the bench venv
(mk/bench.mk). Nothing in ``modeltap`` imports this package.
"""
