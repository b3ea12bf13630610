# The journey tier (tests/journey): the README's quickstart run as written, from a fresh venv installed
# from a copy of the repository, then the commands a new user reaches for next. Its own pytest process,
# after the others: it binds the port the quickstart names (8000) and installs a venv of its own.

.PHONY: journey-test

journey-test: venv agents
	$(VENV)/bin/python -m pytest tests/journey $(JOURNEY_PYTEST_ARGS)

TEST_TIERS += journey-test
