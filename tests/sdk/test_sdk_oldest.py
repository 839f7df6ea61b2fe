"""The SDK on the oldest runtime it supports, against daemons on the newest.

The client-side install (``pip install cxlkv``: the SDK) accepts protobuf 5.29.1
and grpcio 1.70.0 and newer, so it installs beside inference engines that pin
those packages (LMCache 0.5.6: protobuf < 7 and grpcio 1.78.0). These tests run
the SDK and the Mooncake shim in .venv-oldest (exactly those floors: see
``OLDEST_PINS`` in the Makefile) against a real cluster whose master and clientds
run in the project's own environment (protobuf 7, grpcio 1.85), and check that
bytes written from either environment read back exact from the other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oldest_env import oldest_python

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mooncake_app.py"
SUBPROCESS_TIMEOUT_S = 180

#: Run in .venv-oldest: prints the runtime versions, then writes and reads through
#: both SDK protocols and the shim; every import warning is an error.
_OLD_SIDE = r"""
import json, sys, warnings
warnings.simplefilter("error")
import google.protobuf, grpc
import cxlkv.client, cxlkv.compat.mooncake
from cxlkv import Client
from cxlkv.errors import NotFound
from cxlkv.compat.mooncake import MooncakeDistributedStore
sock, prefix = sys.argv[1], sys.argv[2]
out = {"protobuf": google.protobuf.__version__, "grpcio": grpc.__version__}
for proto in ("lean", "grpc"):
    with Client(sock, protocol=proto) as c:
        small, big = bytes(range(256)) * 16, bytes(reversed(range(256))) * (1 << 14)   # 4 KiB, 4 MiB
        c.put(f"{prefix}{proto}/small", small)
        c.put(f"{prefix}{proto}/big", big)
        assert c.get(f"{prefix}{proto}/small") == small and c.get(f"{prefix}{proto}/big") == big
        try:
            c.get(f"{prefix}{proto}/missing")
            raise AssertionError("no NotFound")
        except NotFound as exc:
            out[f"{proto}_missing"] = type(exc).__name__
        out[f"{proto}_listed"] = sorted(k.key for k in c.list(f"{prefix}{proto}/"))
        out[f"{proto}_stat_version"] = c.stat()["version"]
s = MooncakeDistributedStore()
assert s.setup("old", "P2PHANDSHAKE", 0, 0, "tcp", "", "", cxlkv_socket=sock) == 0
assert s.put(f"{prefix}shim", b"from the oldest runtime") == 0
out["shim_get"] = s.get(f"{prefix}shim").decode()
out["shim_missing"] = s.get_size(f"{prefix}nothing")
out["new_side"] = s.get(f"{prefix}new").hex()
s.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def old_python() -> Path:
    return oldest_python()


def _run_old(old_python: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(old_python), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, env={**os.environ, **(env or {})})


def test_oldest_env_holds_the_floors_and_resolves(old_python: Path) -> None:
    r = _run_old(old_python, "-m", "pip", "check")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run_old(old_python, "-c", "import google.protobuf, grpc, numpy; "
                 "print(google.protobuf.__version__, grpc.__version__, numpy.__version__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["5.29.1", "1.70.0", "1.26.4"]


def test_sdk_and_shim_on_oldest_runtime_against_live_cluster(module_cluster, old_python: Path) -> None:
    from cxlkv import Client

    prefix = "oldest/"
    new_value = np.random.default_rng(7).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    with module_cluster.client(1) as c:
        c.put(f"{prefix}new", new_value)
    r = _run_old(old_python, "-c", _OLD_SIDE, module_cluster.socket_path(0), prefix)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["protobuf"], out["grpcio"]) == ("5.29.1", "1.70.0")
    for proto in ("lean", "grpc"):
        assert out[f"{proto}_missing"] == "NotFound"
        assert out[f"{proto}_listed"] == [f"{prefix}{proto}/big", f"{prefix}{proto}/small"]
        assert out[f"{proto}_stat_version"]
    assert out["shim_get"] == "from the oldest runtime"
    assert out["shim_missing"] == -704
    assert bytes.fromhex(out["new_side"]) == new_value  # written by the newest runtime, read by the oldest
    with Client(module_cluster.socket_path(1)) as c:  # and the other way, on the other host
        assert c.get(f"{prefix}lean/big") == bytes(reversed(range(256))) * (1 << 14)
        assert c.get(f"{prefix}shim") == b"from the oldest runtime"
        assert c.remove_all(regex=f"^{prefix}") == 6


def test_mooncake_example_on_oldest_runtime(module_cluster, old_python: Path) -> None:
    r = _run_old(old_python, "-W", "error::UserWarning", str(EXAMPLE),
                 env={"CXLKV_SOCKET": module_cluster.socket_path(0), "MOONCAKE_APP_PREFIX": "oldest-app"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "mooncake_app: all checks passed" in r.stdout
