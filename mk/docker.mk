# The Docker tier's test image: an empty root with the usr-merge links, run with the host's
# /usr mounted read-only, built with `docker import` because no registry is reachable. The tier's
# conftest builds it too; this target is for running examples/bundle.toml by hand.

.PHONY: docker-image

docker-image: venv dockerd
	$(VENV)/bin/python -m tests.docker.hostroot
