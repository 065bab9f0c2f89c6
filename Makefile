# Two entry points: `make demo` and `make test`. Both create .venv on first use (so do `make docs` and `make bench`).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-16)

.PHONY: demo test docs bench clean

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
	$(PY) -m pytest

# The documentation site (mkdocs.yml) into the git-ignored site/; --strict turns every warning into a failure.
# NO_MKDOCS_2_WARNING silences mkdocs-material's end-of-life banner, which is not a build warning.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) build site *.egg-info
