# modeltap: `make demo` and `make test` do all the set-up on a fresh Debian machine (as root) by themselves.
#
# Set-up lives in mk/install.mk; other tiers add their own fragment in mk/*.mk. A fragment that adds a
# test tier defines a target and appends its name to TEST_TIERS (`TEST_TIERS += areal-test`), and
# `make test` then runs it after the pytest tiers.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
# The tiers pytest runs in one process; each must exist (a missing tier fails, it never skips).
PYTEST_DIRS := tests/unit tests/integration tests/docker tests/ui
PYTEST_ARGS ?=
TEST_TIERS :=

# Included before the rules below so that TEST_TIERS is complete when `test` reads it.
-include mk/*.mk

.PHONY: help test test-pytest lint demo fuzz

help:
	@echo "make test    install everything (venv, agent CLIs, dockerd, chromium) and run every tier: lint test-pytest $(TEST_TIERS)"
	@echo "make demo    install only what the demo uses (the openai SDK, opencode) and run 'modeltap demo'"
	@echo "make lint    ruff check, ruff format --check, mypy --strict on the package"
	@echo "make fuzz    the pytest tiers with new hypothesis examples each run (make test draws the same ones)"
	@echo "make bench   modeltap side by side with its peers, and its store at 1M exchanges (benchmarks/README.md)"
	@echo "make setup   only the set-up (targets: venv, agents, dockerd, chromium)"

# Every tier runs even when an earlier one fails, so one failure does not hide the others; the exit
# status is still non-zero if any tier failed.
test: setup
	@failed=""; \
	for tier in lint test-pytest $(TEST_TIERS); do \
	    $(MAKE) --no-print-directory "$$tier" || failed="$$failed $$tier"; \
	done; \
	if [ -n "$$failed" ]; then echo "make test: FAILED tiers:$$failed" >&2; exit 1; fi; \
	echo "make test: all tiers passed (lint test-pytest $(TEST_TIERS))"

# pytest exits 5 when it collects nothing, which fails this target like any other non-zero status. Line
# coverage of the package is measured over every tier (subprocesses included) and each module held to
# its floor in tests/coverage_floors.json.
test-pytest: setup
	rm -f .coverage .coverage.*
	$(VENV)/bin/python -m pytest $(PYTEST_DIRS) --cov=modeltap --cov-report= $(PYTEST_ARGS)
	$(VENV)/bin/python scripts/coverage_floor.py

# The property tests with examples drawn afresh: a finding here becomes an `@example` of its test.
fuzz: setup
	HYPOTHESIS_PROFILE=explore $(VENV)/bin/python -m pytest $(PYTEST_DIRS) $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Only what the demo plays: the openai SDK (the demo extra) and opencode, not the test set-up.
demo: demo-venv demo-agents
	$(VENV)/bin/modeltap demo
