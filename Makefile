# cxlkv — the two commands a newcomer needs are `make run` and `make test`.
# Both create .venv and build the C transport on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CXLKV  := $(VENV)/bin/cxlkv
STAMP  := $(VENV)/.install-stamp
TRACE  ?= ../shared/traces/conversation_trace.jsonl
PYTEST_ARGS ?=
BENCH_ARGS ?=

INSTALL_DEPS := pyproject.toml setup.py $(wildcard transport/*.c transport/*.h transport/build_transport.py)

.PHONY: install test run proto bench clean help etcd

help:
	@echo "make run     - start a local cluster on an emulated CXL region and replay the real trace"
	@echo "make test    - run the test suite (installs etcd for the leader-election tests when it can)"
	@echo "make install - create $(VENV) and install cxlkv with its C transport"
	@echo "make proto   - regenerate the gRPC stubs from proto/"
	@echo "make bench   - run every benchmark, write bench/results/*.json and a summary"
	@echo "               (BENCH_ARGS='--compare mooncake' adds the peer, BENCH_ARGS=--quick a smoke run)"

install: $(STAMP)

$(STAMP): $(INSTALL_DEPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: install etcd
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The leader-election tests (tests/test_ha.py) run a real etcd: Debian's etcd-server.
# Installed here when missing and we may (root with apt-get); else they skip with one line.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing etcd (Debian's etcd-server) for the leader-election tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1; } || \
	      echo "etcd could not be installed: tests/test_ha.py skips (apt-get install -y etcd-server)"; \
	  else echo "etcd not found: tests/test_ha.py skips (sudo apt-get install -y etcd-server)"; fi; }

run: install
	$(CXLKV) replay $(TRACE) --embedded

proto: install
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/cxlkv/v1/*.proto
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/cxlkv/etcd/etcd_v3.proto

bench: install
	$(CXLKV) bench all --json-dir bench/results $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info transport/*.so
