# The Phoenix tier: modeltap's OpenTelemetry export read back from a real tracing backend, Arize Phoenix
# (tests/phoenix). Phoenix lives in its own venv, because arize-phoenix 20.26.1 requires anthropic<2 and
# the test extra pins anthropic 2.x; scripts/phoenix.sh installs it from the lock requirements/phoenix.txt,
# rebuilding only when the lock changes (about 60 s cold, instant after), and the tier's fixture starts it
# offline on loopback (docs/otel.md §4). A missing prerequisite fails the install; nothing is skipped.
# The exact attributes and the failing backends are tested against a plain receiver in the pytest tiers
# (tests/integration/test_otlp_export.py).

PHOENIX_PYTEST_ARGS ?=

.PHONY: phoenix-venv phoenix-test

phoenix-venv:
	scripts/phoenix.sh install

# `agents`: the tier drives opencode through modeltap serve.
phoenix-test: venv agents phoenix-venv
	$(VENV)/bin/python -m pytest tests/phoenix $(PHOENIX_PYTEST_ARGS)

TEST_TIERS += phoenix-test
