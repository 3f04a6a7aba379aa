# Set-up and everyday commands. `make demo` and `make test` work on a fresh machine with
# Python 3.11+: they create .venv and install kvrouter into it with its development tools.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install proto demo test lint typecheck unit tools clean

install: $(STAMP)

$(STAMP): pyproject.toml setup.py $(wildcard router/core/hotpath-c/*.[ch])
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# The gossip protocol's Python code is committed in router/gossip/pb/, so that every install
# (wheel, sdist, editable, the image) has it without a protobuf compiler. Run this after editing
# proto/gossip.proto; tests/gossip/test_generated_code.py fails until the two agree. Envoy's
# ext_proc protos (proto/vendor/) are generated likewise into router/gateway/extproc/pb/.
proto: install
	$(PY) -m grpc_tools.protoc -Iproto --python_out=router/gossip/pb --pyi_out=router/gossip/pb \
	  proto/gossip.proto
	$(PY) proto/generate_extproc.py

demo: install
	$(VENV)/bin/kvrouter demo

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

# promtool (Debian's prometheus package) checks the /metrics exposition, and tmux is the real
# terminal `kvrouter top` is tested in; each is installed when missing and this is a Debian
# machine we administer, and skipped by its test otherwise.
tools:
	@missing=""; command -v promtool >/dev/null || missing="$$missing prometheus"; \
	  command -v tmux >/dev/null || missing="$$missing tmux"; \
	  [ -z "$$missing" ] || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $$missing >/dev/null; } ; } || echo "not installed:$$missing"

unit: install tools
	$(VENV)/bin/pytest -q

test: lint typecheck unit

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
