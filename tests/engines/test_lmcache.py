"""LMCache 0.5.6's own ``mooncakestore://`` connector on a live cxlkv cluster (``make test-engines``).

The engine runs in its own environment (.venv-engines: LMCache with CPU torch,
cxlkv's SDK-only install, the import hook's ``.pth``), the cluster in the
project's. Each test writes through LMCache on one clientd ("host") and reads
through a new LMCache backend on the other, byte-exact. Without
``CXLKV_ENGINES_PYTHON`` (set by ``make test-engines``) the module is skipped:
``make test`` does not download the engines.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ENGINES_PYTHON = os.environ.get("CXLKV_ENGINES_PYTHON", "")
pytestmark = pytest.mark.skipif(not ENGINES_PYTHON, reason="engine environment not set up: run `make test-engines`")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MiB = 1 << 20
CLUSTER_OPTIONS = {"region_size_bytes": 384 * MiB}
TIMEOUT_S = 600


def _engine(script: str, *args: str, socket_path: str) -> dict:
    env = {**os.environ, "CXLKV_AS_MOONCAKE": "1", "CXLKV_SOCKET": socket_path, "PYTHONHASHSEED": "0"}
    r = subprocess.run([ENGINES_PYTHON, str(HERE / script), *args], capture_output=True, text=True,
                       timeout=TIMEOUT_S, env=env, cwd="/")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert r.returncode == 0 and lines, r.stdout[-4000:] + r.stderr[-4000:]
    return json.loads(lines[-1])


@pytest.mark.parametrize("chunks,tokens", [(16, 256), (4, 4096)], ids=["2MiB-chunks", "32MiB-chunks"])
def test_lmcache_remote_backend_across_hosts(module_cluster, chunks: int, tokens: int) -> None:
    prefix = f"lmc-{chunks}x{tokens}"
    put = _engine("lmcache_remote.py", "put", prefix, str(chunks), str(tokens),
                  socket_path=module_cluster.socket_path(0))
    assert put["matched"] == chunks and put["store"] == "cxlkv.compat.mooncake.store"
    got = _engine("lmcache_remote.py", "get", prefix, str(chunks), str(tokens),
                  socket_path=module_cluster.socket_path(1))
    assert got["matched"] == chunks
    assert put["chunk_bytes"] == tokens * 8192


def test_lmcache_engine_stores_on_one_host_and_retrieves_on_another(module_cluster) -> None:
    stored = _engine("lmcache_engine.py", "store", "engine-1000", "1000", socket_path=module_cluster.socket_path(0))
    assert stored["stored"] and stored["remote_hit_tokens"] == 1000
    got = _engine("lmcache_engine.py", "retrieve", "engine-1000", "1000", socket_path=module_cluster.socket_path(1))
    assert got["lookup_tokens"] == 1000 and got["retrieved_tokens"] == 1000 and got["bit_exact"]


def test_engine_env_versions_and_hook(module_cluster) -> None:
    code = """
import json, google.protobuf, grpc, lmcache, torch, cxlkv, mooncake.store
try:
    import mooncake.engine
    engine = "real"
except ModuleNotFoundError:
    engine = "absent"
from importlib.metadata import version
print(json.dumps({"protobuf": google.protobuf.__version__, "grpcio": grpc.__version__,
                  "lmcache": version("lmcache"), "torch": torch.__version__,
                  "store": mooncake.store.MooncakeDistributedStore.__module__, "engine": engine}))
"""
    env = {**os.environ, "CXLKV_AS_MOONCAKE": "1"}
    r = subprocess.run([ENGINES_PYTHON, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True,
                       timeout=TIMEOUT_S, env=env, cwd="/")
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["lmcache"] == "0.5.6" and out["protobuf"].startswith("6.") and out["grpcio"] == "1.78.0"
    assert out["store"] == "cxlkv.compat.mooncake.store" and out["engine"] == "absent"


def test_device_pointer_refused_where_torch_has_no_cuda(module_cluster) -> None:
    code = """
import sys
from cxlkv.compat.mooncake import MooncakeDistributedStore, devices
devices.set_classifier(lambda p: 0 if p == 0x1000 else devices.HOST)   # "device 0": the path without a GPU
s = MooncakeDistributedStore()
assert s.setup("h", "P2PHANDSHAKE", 0, 0, "tcp", "", "", cxlkv_socket=sys.argv[1]) == 0
print(s.put_from("dev", 0x1000, 4096), s.is_exist("dev"))
s.close()
"""
    r = subprocess.run([ENGINES_PYTHON, "-c", code, module_cluster.socket_path(0)], capture_output=True, text=True,
                       timeout=TIMEOUT_S, cwd="/")
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.split() == ["-600", "0"]
    assert "torch cannot reach here" in r.stderr
