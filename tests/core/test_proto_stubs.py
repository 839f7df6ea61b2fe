"""The committed gRPC stubs must match what `make proto` generates from proto/.

`make proto` runs the grpcio-tools pinned in the Makefile (the SDK's oldest
supported runtime, in .venv-oldest), so this test builds that environment with
`make oldest` when it is missing (tests/sdk/test_sdk_oldest.py uses the same one).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from oldest_env import oldest_python

ROOT = Path(__file__).resolve().parents[2]


def test_committed_stubs_are_fresh(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))
    assert protos, "no .proto files found"
    subprocess.run(
        [str(oldest_python()), "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}",
         f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *[f"proto/{p}" for p in protos]],
        cwd=ROOT, check=True,
    )
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    assert generated
    stale = [str(p) for p in generated if (tmp_path / p).read_bytes() != (ROOT / p).read_bytes()]
    assert not stale, f"stale stubs (run `make proto` and commit): {stale}"


def test_error_enum_matches_python_hierarchy() -> None:
    from cxlkv import errors
    from cxlkv.v1 import common_pb2

    assert len(errors.ErrorCode) == len(common_pb2.ErrorCode.items())
    for name, value in common_pb2.ErrorCode.items():
        assert errors.ErrorCode[name] == value
        if value:
            err = errors.error_for(value, "m")
            assert err.code == value
            assert errors.GRPC_STATUS[err.code] is not None
