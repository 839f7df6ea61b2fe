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

.PHONY: install test run proto bench wheel clean help

help:
	@echo "make run     - start a local cluster on an emulated CXL region and replay the real trace"
	@echo "make test    - run the test suite"
	@echo "make install - create $(VENV) and install cxlkv with its C transport"
	@echo "make proto   - regenerate the gRPC stubs from proto/"
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
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

run: install
	$(CXLKV) replay $(TRACE) --embedded

proto: install
	$(PY) -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/cxlkv/v1/*.proto

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
	rm -rf $(VENV) build dist *.egg-info transport/*.so
