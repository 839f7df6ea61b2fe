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

.PHONY: install test run proto bench clean help

help:
	@echo "make run     - start a local cluster on an emulated CXL region and replay the real trace"
	@echo "make test    - run the test suite"
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

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

run: install
	$(CXLKV) replay $(TRACE) --embedded

proto: install
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/cxlkv/v1/*.proto

bench: install
	$(CXLKV) bench all --json-dir bench/results $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info transport/*.so
