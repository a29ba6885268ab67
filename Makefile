# censusdp: `make demo` and `make test` are the only two commands a user needs;
# `make test-all` also runs the long tests marked `slow`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-all lint bench clean docs docs-check

install: $(STAMP)

# The dev set is installed by uv (Astral's resolver and installer, from the registry): it
# downloads in parallel and leaves bytecode to the first import, about 10 s of CPU where pip
# spends 90 s. The venv is made without pip, and the interpreter's own pip puts uv into it.
# Anything failing on that path (an old pip, no uv wheel for the platform, a registry uv cannot
# reach) falls back to pip in the venv. A venv that has uv already reinstalls only censusdp.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv --without-pip $(VENV)
	if { test -x $(BIN)/uv || $(PYTHON) -m pip --python $(BIN)/python install --quiet "uv>=0.5"; } \
	    && $(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[dev,docs]"; then :; else \
	  echo "uv unavailable: installing with pip" >&2; \
	  $(BIN)/python -m ensurepip --upgrade --default-pip \
	    && $(BIN)/python -m pip install --quiet --upgrade pip \
	    && $(BIN)/python -m pip install --quiet -e ".[dev,docs]"; fi
	touch $(STAMP)

demo: install
	$(BIN)/censusdp demo --overwrite

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# One pytest worker per core (`make test WORKERS=1` for one); a test file stays on one worker,
# so its module-scoped fixtures run once.
WORKERS ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider -n $(WORKERS) --dist loadfile --durations=15
# Bytecode is written and the package compiled once up front: every pytest worker, Dask worker,
# notebook kernel and CLI subprocess of the suite then loads it instead of compiling it again
# (an environment that sets PYTHONDONTWRITEBYTECODE would otherwise recompile it in each).
PACKAGES := censusdp hierarchy mechanisms estimation pipelines experiments app
COMPILE := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m compileall -q -j 2 $(PACKAGES)

test: install lint docs-check
	$(COMPILE)
	PYTHONDONTWRITEBYTECODE= $(PYTEST) -m "not slow"

test-all: install lint
	$(COMPILE)
	PYTHONDONTWRITEBYTECODE= $(PYTEST)

# The documentation site (mkdocs.yml, docs/): warnings are errors, so a broken link, a missing
# API name or a stale generated page fails the build. `make docs` writes site/; `make
# docs-check` builds the same into a temporary folder (what `make test` and CI run).
# (the two variables silence a banner about MkDocs 2 that a dependency prints on every build)
MKDOCS := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs
docs: install
	$(BIN)/python docs/gen/hooks.py
	$(MKDOCS) build --strict --site-dir site

docs-check: install
	$(BIN)/python docs/gen/hooks.py
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(MKDOCS) build --strict --site-dir "$$tmp"

bench: install
	for f in benchmarks/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info results site
