# Set-up for the tests and the demo. Each step is idempotent, and instant once done (stamp files):
#   venv     .venv with `pip install -e '.[test]'`; redone when pyproject.toml changes
#   agents   opencode and Claude Code from npm into $(NPM_PREFIX) (versions: docs/agents.md §1)
#   dockerd  docker.io from apt when missing, dockerd started when not answering (checked every time)
#   chromium Debian's chromium, for the web viewer's browser tests (checked every time)
#   zsh      Debian's zsh, for the completion tests (bash is there already; checked every time)

NPM_PREFIX := .cache/npm
OPENCODE_VERSION := 1.18.33
CLAUDE_CODE_VERSION := 2.1.332

# The stamps live inside what they describe, so deleting .venv or .cache/npm also forgets the stamp;
# the agent stamp names the versions, so changing a pin reinstalls.
VENV_STAMP := $(VENV)/.modeltap-installed
AGENTS_STAMP := $(NPM_PREFIX)/.installed-opencode-$(OPENCODE_VERSION)-claude-code-$(CLAUDE_CODE_VERSION)

.PHONY: setup venv agents dockerd chromium zsh

setup: venv agents dockerd chromium zsh

venv: $(VENV_STAMP)

$(VENV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $@

agents: $(AGENTS_STAMP)

$(AGENTS_STAMP):
	scripts/install-agents.sh $(NPM_PREFIX) opencode-ai@$(OPENCODE_VERSION) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	touch $@

dockerd:
	scripts/ensure-dockerd.sh

chromium:
	command -v chromium >/dev/null || scripts/apt-install.sh chromium

zsh:
	command -v zsh >/dev/null || scripts/apt-install.sh zsh
