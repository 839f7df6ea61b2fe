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

.PHONY: install test run proto bench clean help oldest test-oldest engines test-engines

help:
	@echo "make run     - start a local cluster on an emulated CXL region and replay the real trace"
	@echo "make test    - run the test suite"
	@echo "make install - create $(VENV) and install cxlkv with its C transport"
	@echo "make proto   - regenerate the gRPC stubs from proto/ (with the pinned grpcio-tools of $(OLDEST))"
	@echo "make test-oldest - the SDK on the oldest protobuf/grpcio it supports (in $(OLDEST))"
	@echo "make test-engines - LMCache's own Mooncake connector on a live cluster (in $(ENGINES); ~180 MB of downloads)"
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

# The committed stubs are generated for the oldest runtime the SDK supports, so
# that it installs beside inference engines that pin protobuf/grpcio (LMCache
# 0.5.6: protobuf < 7, grpcio 1.78.0). protobuf's gencode check accepts any
# runtime >= the gencode (5.29.0 .. 7.x) and gRPC's any grpcio >= the tools'.
# $(OLDEST) holds exactly these floors and the SDK (docs/compat-mooncake.md).
OLDEST ?= .venv-oldest
OLDEST_PINS := grpcio==1.70.0 grpcio-status==1.70.0 grpcio-tools==1.70.0 protobuf==5.29.1 \
               numpy==1.26.4 cffi==1.16.0 xxhash==3.4.1
OLDEST_STAMP := $(OLDEST)/.install-stamp

oldest: $(OLDEST_STAMP)

$(OLDEST_STAMP): $(INSTALL_DEPS) Makefile
	test -x $(OLDEST)/bin/python || $(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/python -m pip install -q -e . $(OLDEST_PINS) pytest
	touch $(OLDEST_STAMP)

test-oldest: install oldest
	$(PY) -m pytest -q tests/test_sdk_oldest.py $(PYTEST_ARGS)

# Inference engines beside the SDK, in their own environment (not part of `make
# test`: large downloads). CPU torch is the local wheel; the import hook's .pth
# makes `mooncake.store` cxlkv's wherever CXLKV_AS_MOONCAKE=1 (docs/compat-mooncake.md).
ENGINES ?= .venv-engines
ENGINES_PINS := lmcache==0.5.6 torch==2.13.0
# Mooncake's own wheel beside them (no deps: only its modules are imported), so the
# hook is checked against the real mooncake.engine; it needs libibverbs1, librdmacm1
# and libnuma1 from the OS to import (the test is skipped without them).
ENGINES_MOONCAKE := mooncake-transfer-engine-non-cuda==0.3.13.post1
ENGINES_STAMP := $(ENGINES)/.install-stamp

engines: $(ENGINES_STAMP)

$(ENGINES_STAMP): $(INSTALL_DEPS) Makefile
	test -x $(ENGINES)/bin/python || $(PYTHON) -m venv $(ENGINES)
	$(ENGINES)/bin/python -m pip install -q -e . $(ENGINES_PINS)
	$(ENGINES)/bin/python -m pip install -q --no-deps $(ENGINES_MOONCAKE)
	echo "import cxlkv.compat.mooncake_alias" > \
	  "$$($(ENGINES)/bin/python -c 'import site; print(site.getsitepackages()[0])')/cxlkv-mooncake.pth"
	touch $(ENGINES_STAMP)

test-engines: install engines
	CXLKV_ENGINES_PYTHON=$(abspath $(ENGINES))/bin/python $(PY) -m pytest -q tests/engines $(PYTEST_ARGS)

proto: oldest
	$(OLDEST)/bin/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/cxlkv/v1/*.proto

bench: install
	$(CXLKV) bench all --json-dir bench/results $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(OLDEST) $(ENGINES) build *.egg-info transport/*.so
