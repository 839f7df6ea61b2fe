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

INSTALL_DEPS := pyproject.toml setup.py $(wildcard transport/*.c transport/*.h transport/c/*.c transport/c/*.h transport/build_transport.py)

.PHONY: install test run proto bench wheel clean help oldest test-oldest engines test-engines etcd

help:
	@echo "make run     - start a local cluster on an emulated CXL region and replay the real trace"
	@echo "make test    - run the test suite (installs etcd for the leader-election tests when it can)"
	@echo "make install - create $(VENV) and install cxlkv with its C transport"
	@echo "make proto   - regenerate the gRPC stubs from proto/ (with the pinned grpcio-tools of $(OLDEST))"
	@echo "make test-oldest - the SDK on the oldest protobuf/grpcio it supports (in $(OLDEST))"
	@echo "make test-engines - LMCache's own Mooncake connector on a live cluster (in $(ENGINES); ~180 MB of downloads)"
	@echo "make wheel   - build dist/cxlkv-*-cp311-abi3-*.whl and the sdist (manylinux with auditwheel on PATH)"
	@echo "make bench   - run every benchmark, write bench/results/*.json and a summary"
	@echo "               (BENCH_ARGS='--compare mooncake' adds the peer, BENCH_ARGS=--quick a smoke run)"

install: $(STAMP)

# A .venv made by another Python than $(PYTHON) (another version, or an old
# python3 before a newer one was installed) is made again: its C extension and
# wheels belong to that interpreter.
PYVER_CMD := import sys; print(sys.implementation.name, *sys.version_info[:2])
VENV_PYVER := $(shell test -x $(PY) && $(PY) -c '$(PYVER_CMD)' 2>/dev/null)
WANT_PYVER := $(shell $(PYTHON) -c '$(PYVER_CMD)' 2>/dev/null)
ifneq ($(VENV_PYVER),)
ifneq ($(WANT_PYVER),)
ifneq ($(VENV_PYVER),$(WANT_PYVER))
$(STAMP): FORCE_VENV
endif
endif
endif

.PHONY: FORCE_VENV
FORCE_VENV:
	@echo "$(VENV) was made by $(VENV_PYVER), not by $(PYTHON) ($(WANT_PYVER)): making it again"
	rm -rf $(VENV)

$(STAMP): $(INSTALL_DEPS)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "cxlkv needs Python >= 3.11; $(PYTHON) is " + sys.version.split()[0] + " (make PYTHON=python3.11 …)")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip "setuptools>=77" wheel
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: install etcd
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The leader-election tests (tests/cluster/test_ha.py) run a real etcd: Debian's etcd-server.
# Installed here when missing and we may (root with apt-get); else they skip with one line.
etcd:
	@command -v etcd >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing etcd (Debian's etcd-server) for the leader-election tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends etcd-server >/dev/null 2>&1; } || \
	      echo "etcd could not be installed: tests/cluster/test_ha.py skips (apt-get install -y etcd-server)"; \
	  else echo "etcd not found: tests/cluster/test_ha.py skips (sudo apt-get install -y etcd-server)"; fi; }

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
	$(PY) -m pytest -q tests/sdk/test_sdk_oldest.py $(PYTEST_ARGS)

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
	$(OLDEST)/bin/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/cxlkv/etcd/etcd_v3.proto

# One abi3 wheel for every CPython >= 3.11 and the sdist, in dist/. With auditwheel
# (and patchelf) on PATH the wheel is also repaired to the manylinux tag this
# machine's glibc allows (manylinux_2_34 on Debian 12; build in a manylinux image
# for older systems).
wheel: install
	rm -rf dist
	$(PY) -m pip wheel --no-deps --no-build-isolation -q -w dist .
	$(PY) -c 'from setuptools import build_meta; build_meta.build_sdist("dist")'
	@if command -v auditwheel >/dev/null; then \
	    auditwheel repair -w dist dist/cxlkv-*-linux_*.whl && rm dist/cxlkv-*-linux_*.whl; \
	else echo "(auditwheel not on PATH: the wheel keeps its linux_* tag)"; fi
	@ls dist

bench: install
	$(CXLKV) bench all --json-dir bench/results $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(OLDEST) $(ENGINES) build dist *.egg-info transport/*.so
