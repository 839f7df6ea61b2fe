#!/usr/bin/env bash
# Prepare, on a machine with registry access, the wheels bench/gpu_device_run.sh
# installs on the GPU machine (which cannot reach any registry; its python3 is
# 3.12 with torch, numpy, xxhash, click, tabulate, prometheus-client and
# sortedcontainers already there — docs: /work/.library/device/README.md).
#
# Usage, in the repository root:   bash bench/gpu_wheels.sh
# Then the device tool:            run(command="bash bench/gpu_device_run.sh", carry=[".whl"], timeout_s=540)
#
# Writes .whl/ (ignored through .git/info/exclude): cxlkv itself built for
# CPython 3.12 (with its compiled transport), and the runtime dependencies the
# GPU image lacks or may hold in an older version, pinned to what this tree is
# tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-python3.12}
EXCLUDE="$(git rev-parse --git-common-dir)/info/exclude"
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
rm -rf .whl && mkdir -p .whl
VENV_PY=${VENV_PY:-.venv/bin/python}
ver() { "$VENV_PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
PLATS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
       --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATS[@]}" -d .whl \
  "cffi==$(ver cffi)" "grpcio==$(ver grpcio)" "grpcio-health-checking==$(ver grpcio-health-checking)" \
  "grpcio-reflection==$(ver grpcio-reflection)" "grpcio-status==$(ver grpcio-status)" \
  "protobuf==$(ver protobuf)" "tomli-w==$(ver tomli-w)" "pycparser==$(ver pycparser)"
"$PY312" -m pip wheel -q --no-deps -w .whl .
ls -la .whl
du -sh .whl
