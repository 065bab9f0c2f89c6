# Two entry points: `make demo` and `make test`. Both create .venv on first use (so do `make check`, `make docs` and
# `make bench`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)
BENCH_STAMP := $(VENV)/.bench-installed-$(shell sha256sum pyproject.toml | cut -c1-16)

.PHONY: demo test check docs bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/digits.py

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest

# A developer's fast check (< 5 min on 2 cores): ruff, mypy and the tests that stay in the pytest process, plus the
# smoke tests (one launch per launcher, one ZeRO, one fault). `make test` runs every test (docs/design.md, "Tests").
check: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -m "smoke or not (subprocess or distributed)"

# The documentation site (mkdocs.yml) into the git-ignored site/; --strict turns every warning into a failure.
# NO_MKDOCS_2_WARNING silences mkdocs-material's end-of-life banner, which is not a build warning.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The [bench] extra adds Lightning for the side-by-side rows; without it those rows are left out.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,bench]" && rm -f $(VENV)/.bench-installed-* && touch $(BENCH_STAMP) \
		|| echo "could not install the [bench] extra (Lightning): benchmarking without it"

# Every benchmark, one after another; rewrites docs/benchmarks.md and docs/img/bench_*.png (<= 15 min on 2 cores).
bench: $(BENCH_STAMP)
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build site *.egg-info
