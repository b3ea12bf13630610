# The AReaL 2.0 tier: modeltap against the real code of AReaL 2.0.0 (tag v2.0.0, fee938e) and of main
# (cbff54d), on CPU: the v1 agent proxy and the inline workflow (tests/areal, the 1.0.4 tier's tests)
# and the v2 router, data proxy, gateway and controller (tests/areal2).
#
# PyPI has AReaL only up to 1.0.4, so each tree is installed from its source archive
# (AREAL2_VENDOR/areal-<tree>-src.tar.gz, unchanged from github.com/areal-project/AReaL at those
# commits; with internet, `git archive` of the same commit gives the same files). One venv holds the
# pinned set of the 1.0.4 tier (requirements/areal-tier.txt: it imports all of AReaL 2.0 and main) and
# gets each tree installed over it in turn, `--no-deps`, in seconds. A missing archive, python3.11 or
# pinned wheel fails the install; nothing is skipped. Times: docs/areal.md §11.

AREAL2_VENV := .venv-areal2
AREAL2_PYTHON ?= python3.11
AREAL2_VENDOR ?= ../shared/vendor
AREAL2_TREES := 2.0.0 main-cbff54d
AREAL2_SRC := .cache/areal-src
AREAL2_STAMP := $(AREAL2_VENV)/.modeltap-installed
AREAL2_PINS := requirements/areal2-tier-nodeps.txt requirements/areal-tier.txt

$(AREAL2_STAMP): $(AREAL2_PINS) pyproject.toml
	$(call areal_tier_venv,$(AREAL2_PYTHON),$(AREAL2_VENV),requirements/areal2-tier-nodeps.txt)

# One tree's source, unpacked once (its folder is AReaL-<tree>); kept, not deleted as an intermediate.
.PRECIOUS: $(AREAL2_SRC)/%/.unpacked
$(AREAL2_SRC)/%/.unpacked: $(AREAL2_VENDOR)/areal-%-src.tar.gz
	rm -rf $(AREAL2_SRC)/$*
	mkdir -p $(AREAL2_SRC)/$*
	tar xzf $< -C $(AREAL2_SRC)/$*
	touch $@

# (areal2-test-TREE is a pattern rule, which make never applies to a .PHONY target.)
.PHONY: areal2-venv areal2-test
areal2-venv: $(AREAL2_STAMP)

# Per tree: AReaL installed over the venv's, then the v1 tier's tests and the v2 tier's, each pytest run
# with its own conftest (--confcutdir, as mk/areal.mk). AREAL2_PYTEST_ARGS adds pytest options.
AREAL2_PYTEST_ARGS ?=
areal2-test-%: $(AREAL2_STAMP) $(AREAL2_SRC)/%/.unpacked agents dockerd
	$(AREAL2_VENV)/bin/pip install -q --no-deps --force-reinstall $(AREAL2_SRC)/$*/AReaL-$*
	$(AREAL_ENV) $(AREAL2_VENV)/bin/python -m pytest tests/areal --confcutdir=tests/areal -p no:cacheprovider \
	    $(AREAL2_PYTEST_ARGS)
	$(AREAL_ENV) $(AREAL2_VENV)/bin/python -m pytest tests/areal2 --confcutdir=tests/areal2 -p no:cacheprovider \
	    $(AREAL2_PYTEST_ARGS)

# The trees one after the other (they share the venv), each run even when the other failed.
areal2-test:
	@failed=""; \
	for tree in $(AREAL2_TREES); do \
	    $(MAKE) --no-print-directory "areal2-test-$$tree" || failed="$$failed $$tree"; \
	done; \
	if [ -n "$$failed" ]; then echo "areal2-test: FAILED on AReaL$$failed" >&2; exit 1; fi

TEST_TIERS += areal2-test
