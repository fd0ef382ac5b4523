# Entry points: `make serve`, `make test` (lint and docs, then pytest), `make extras` (what the tests
# need, installed and nothing run), `make lint` (ruff + mypy), `make docs` (mkdocs build --strict) and
# `make mutants` (the mutation check). Each creates .venv when missing and installs what it needs; a
# stamp file keeps repeat runs fast until pyproject.toml changes.
# JAX 0.11 and later need Python 3.12 or newer: the first such interpreter found (pyenv's installed
# versions too, which its shims hide unless one is selected). PYTHON=... chooses another.
PYTHON ?= $(firstword $(foreach p,python3.12 python3.13 python3 \
            $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.1[2-9]*/bin/python3),\
            $(shell $(p) -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1 && echo $(p))))
VENV   ?= .venv
BIN     = $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
ARGS   ?=
# pytest worker processes: the suite is dominated by XLA compiles, which use one core each.
# Test files are the unit of distribution (--dist loadfile), so module fixtures are built once.
WORKERS ?= 2

.PHONY: serve test extras lint docs mutants install clean locks image test-images

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "no Python 3.12 or newer found: make PYTHON=/path/to/python3.12 ..." >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

# torch==2.13.0 first, so that diffusers' own torch requirement is already satisfied. On a host
# without an NVIDIA GPU (no nvidia-smi) from PyTorch's CPU index (TORCH_CPU_INDEX: 0.2 GB to
# download, 0.7 GB installed); on a GPU host, or where that index does not answer (pip gives up after
# about 10 s), from pip's own indexes: a CPU build where one lies on the host's disk for this Python
# (a find-links folder), else PyPI's Linux build, the CUDA one (4.6 GB installed with its CUDA
# wheels and triton; it runs on a CPU too). The aot extra brings libtpu: the tests compile decode
# programs for a TPU slice without a TPU; the bench extra (matplotlib) lets mypy check the bench scripts.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	if command -v nvidia-smi >/dev/null 2>&1 || \
	   ! $(BIN)/pip install -q --no-cache-dir --index-url $(TORCH_CPU_INDEX) torch==2.13.0; then \
	  $(BIN)/pip install -q --no-cache-dir torch==2.13.0; fi
	$(BIN)/pip install -q -e '.[test,aot,bench]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

# What `make test` installs, and nothing run: the test, aot and bench extras with torch and diffusers
# (the parity tests, diffusers' remote_decode and remote_encode clients).
extras: $(VENV)/.installed-test

serve: $(VENV)/.installed
	$(BIN)/vaeserve serve --host $(HOST) --port $(PORT) $(ARGS)

# ruff (pyflakes, isort, bugbear, pyupgrade) and mypy, configured in pyproject.toml.
lint: $(VENV)/.installed-test
	$(BIN)/ruff check .
	$(BIN)/mypy

# The docs under docs/ (MkDocs): strict, so a broken link, anchor or a page left out of the nav fails.
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict --quiet

# The aot extra is installed here, so the TPU tests fail (rather than skip) without libtpu.
test: lint docs
	VAESERVE_TEST_REQUIRE_LIBTPU=1 $(BIN)/python -m pytest -n $(WORKERS) --dist loadfile $(ARGS)

# The mutation check (docs/development.md): named bugs, each of which the tests named for it must
# catch. ARGS: mutant names, or --list.
mutants: $(VENV)/.installed-test
	$(BIN)/python -m tests.mutants $(ARGS)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache

# ---- shipping: lock files, images and the tests that build and run them (docs/deployment.md) ----
FLAVOUR     ?= cpu
IMAGE       ?= vaeserve:$(FLAVOUR)
# BASE: the Dockerfile's Python image (default python:3.12-slim); IMAGE_FLAGS: more builder flags.
BASE        ?=
IMAGE_FLAGS ?=

# The locks the Dockerfile installs from: exact versions with hashes, for every platform. Versions
# already locked are kept while pyproject.toml admits them; ARGS=--upgrade takes the newest.
locks: $(VENV)/.installed-test
	for flavour in cpu tpu cuda; do \
	  extra=$$([ $$flavour = cpu ] || echo "--extra $$flavour"); \
	  $(BIN)/uv pip compile pyproject.toml $$extra --universal --generate-hashes --quiet \
	    --custom-compile-command "make locks" -o locks/$$flavour.txt $(ARGS) || exit 1; \
	done

# docker when a daemon answers, else buildah (STORAGE_DRIVER / BUILDAH_ISOLATION choose its
# storage and isolation; `--format docker` keeps the HEALTHCHECK, which OCI images drop).
image:
	@if docker info >/dev/null 2>&1; then builder="docker build"; \
	else builder="buildah bud --format docker"; fi; \
	set -x; $$builder --build-arg JAX_FLAVOUR=$(FLAVOUR) $(if $(BASE),--build-arg BASE=$(BASE)) \
	  $(IMAGE_FLAGS) -t $(IMAGE) .

# Build and run the images (root and buildah; .ci/run installs them on a fresh machine).
test-images: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m image tests/shipping $(ARGS)
