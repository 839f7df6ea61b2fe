#!/usr/bin/env bash
# Issue #10 on the GPU machine, in one go: the CUDA tests, the direct-mode tests,
# and `cxlkv bench gpu --json`, with everything the run prints kept under $OUT.
#
# Prepare here first (registry access needed):  bash bench/gpu_wheels.sh
# Then with the device tool, from the repository root:
#     run(command="bash bench/gpu_device_run.sh", carry=[".whl"], timeout_s=540)
# It returns $OUT/gpu.json (commit it as bench/results/gpu.json), device.txt,
# tests.log and bench.log. BENCH_ARGS adds options (e.g. "--quick" for a smoke
# run, "--coherence flush").
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/cxlkv-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/*.whl || { echo "wheel install failed: run bench/gpu_wheels.sh and carry .whl" >&2; exit 3; }
export PYTHONPATH=/tmp/site
# Run from outside the checkout so `cxlkv` is the installed package, not the source folder.
cd /tmp
{
  date -u
  nvidia-smi -L || true
  python3 -c "import torch, cxlkv; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name()); print('cxlkv', cxlkv.__version__)"
  nproc; free -g; df -h /dev/shm
} 2>&1 | tee "$OUT/device.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider --rootdir "$REPO" -c "$REPO/pyproject.toml" \
  "$REPO/tests/test_gpu.py" "$REPO/tests/test_direct.py" 2>&1 | tee "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}
python3 -m cxlkv bench gpu --json --out "$OUT/gpu.json" ${BENCH_ARGS:-} 2> >(tee "$OUT/bench.log" >&2) >/dev/null
bench_rc=$?
echo "tests rc=$tests_rc bench rc=$bench_rc"
exit $(( tests_rc != 0 || bench_rc != 0 ))
