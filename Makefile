# Set-up and everyday commands. `make demo` and `make test` work on a fresh machine with
# Python 3.11+: they create .venv, install kvrouter into it, and generate the gossip code.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck unit tools clean

install: $(STAMP)

$(STAMP): pyproject.toml $(wildcard proto/*.proto)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m router.protogen
	touch $(STAMP)

demo: install
	$(VENV)/bin/kvrouter demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# promtool (Debian's prometheus package) checks the /metrics exposition; installed when
# missing and this is a Debian machine we administer, skipped by its test otherwise.
tools:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus >/dev/null; } ; } || echo "promtool not installed"

unit: install tools
	$(VENV)/bin/pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache router/gossip/pb
