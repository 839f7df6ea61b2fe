"""CUDA tensors in direct mode (issue #10): DMA between the GPU and the region.

Every test but the first needs torch with a CUDA device and is skipped cleanly
without one (run them on a GPU machine: bench/gpu_device_run.sh runs this file
and ``cxlkv bench gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest

from cxlkv.client._cuda import CudaCopier, cuda_available, is_cuda_tensor
from cxlkv.errors import AlreadyExists, InvalidArgument, OutOfRange

MiB = 1 << 20

needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs torch with a CUDA device")


def test_without_cuda_nothing_is_mistaken_for_a_cuda_tensor() -> None:
    assert not is_cuda_tensor(np.zeros(4))
    assert not is_cuda_tensor(b"x")
    if not cuda_available():
        with pytest.raises(InvalidArgument, match="CUDA"):
            CudaCopier()


@needs_cuda
def test_cuda_put_and_get_single_and_batched(cluster) -> None:
    import torch

    dev = torch.device("cuda")
    with cluster.client(0) as a, cluster.client(1) as b, cluster.client(1, direct=False) as d:
        assert a.direct and b.direct
        x = torch.randn(3 * MiB // 2, dtype=torch.float16, device=dev)  # 3 MiB
        a.put_from("gpu/x", x)
        assert d.get("gpu/x") == x.cpu().numpy().tobytes()        # the daemon path reads it
        y = torch.empty_like(x)
        assert b.get_into("gpu/x", y) == x.numel() * 2
        assert torch.equal(x, y)
        # batched: one call for 32 blocks (a layer each)
        blocks = [torch.randn(64 * 1024, dtype=torch.bfloat16, device=dev) for _ in range(32)]
        res = a.put_from_many([f"gpu/l{i}" for i in range(32)], blocks)
        assert all(r.ok for r in res), [r.error for r in res if not r.ok]
        outs = [torch.empty_like(t) for t in blocks]
        got = b.get_into_many([f"gpu/l{i}" for i in range(32)] + ["gpu/absent"],
                              outs + [torch.empty(10, device=dev)])
        assert all(r.ok for r in got[:32]) and not got[32].ok
        assert all(torch.equal(o, t) for o, t in zip(outs, blocks))
        # a daemon-path value read into a CUDA tensor directly, and a host value
        v = np.random.default_rng(1).integers(0, 256, 2 * MiB, dtype=np.uint8)
        d.put_from("gpu/host", v)
        z = torch.empty(2 * MiB, dtype=torch.uint8, device=dev)
        assert b.get_into("gpu/host", z) == 2 * MiB and z.cpu().numpy().tobytes() == v.tobytes()
        # non-contiguous tensors are refused with a clear error
        with pytest.raises(InvalidArgument, match="contiguous"):
            a.put_from("gpu/nc", torch.randn(64, 64, device=dev).t())
        with pytest.raises(InvalidArgument, match="contiguous"):
            b.get_into("gpu/x", torch.empty(64, 64, device=dev).t())
    cluster.assert_invariants()


@needs_cuda
def test_cuda_unregistered_and_without_direct_mode(make_cluster) -> None:
    import torch

    cl = make_cluster(clientd_options={"coherence": "flush"})
    dev = torch.device("cuda")
    with cl.client(0, cuda_register=False) as a, cl.client(1, direct=False) as b:
        x = torch.randint(0, 255, (5 * MiB,), dtype=torch.uint8, device=dev)
        a.put_from("gpu/u", x)                       # unregistered: the driver stages the DMA
        y = torch.empty_like(x)
        assert b.get_into("gpu/u", y) == 5 * MiB     # no direct mode: through a pinned host buffer
        assert torch.equal(x, y)
        b.put_from("gpu/v", y)
        assert a.get("gpu/v") == x.cpu().numpy().tobytes()
    cl.assert_invariants()


# ------------------------------------------------------------------ without a GPU
class _FakeCudaTensor:
    """Host memory posing as a contiguous CUDA tensor (the SDK's duck-typed view)."""

    def __init__(self, array: np.ndarray, contiguous: bool = True) -> None:
        self.array = array
        self.contiguous = contiguous

    def is_contiguous(self) -> bool:
        return self.contiguous

    def numel(self) -> int:
        return self.array.size

    def element_size(self) -> int:
        return self.array.itemsize


class _FakeCopier:
    """Stands in for CudaCopier: the same calls, done with host copies."""

    def __init__(self, *, register: bool = True) -> None:
        self.calls: list[str] = []

    def to_region(self, region, offset, tensor, n, *, hash_):
        import xxhash

        self.calls.append("to_region")
        region.copy_in(offset, tensor.array.view(np.uint8)[:n])
        return xxhash.xxh3_64_intdigest(tensor.array.view(np.uint8)[:n]) if hash_ else 0

    def from_region(self, region, offset, tensor, n):
        import xxhash

        self.calls.append("from_region")
        out = tensor.array.view(np.uint8)[:n]
        region.copy_out(offset, out)
        return xxhash.xxh3_64_intdigest(out)

    def release(self, region) -> None:
        pass

    def close(self) -> None:
        pass


def test_device_tensors_go_through_direct_mode_glue(cluster, monkeypatch) -> None:
    """The SDK's handling of device tensors (single, batched, replicas, errors),
    with a host-memory stand-in for the CUDA copies."""
    import cxlkv.client._client as client_mod
    import cxlkv.client._paths as paths_mod

    monkeypatch.setattr(paths_mod, "is_cuda_tensor", lambda o: isinstance(o, _FakeCudaTensor))
    monkeypatch.setattr(client_mod, "CudaCopier", _FakeCopier)
    rng = np.random.default_rng(3)
    with cluster.client(0) as a, cluster.client(1) as b, cluster.client(1, direct=False) as d:
        x = _FakeCudaTensor(rng.standard_normal(300_000).astype(np.float16))
        a.put_from("dev/x", x)
        assert d.get("dev/x") == x.array.tobytes()
        y = _FakeCudaTensor(np.zeros_like(x.array))
        assert b.get_into("dev/x", y) == x.array.nbytes and (y.array == x.array).all()
        blocks = [_FakeCudaTensor(rng.integers(0, 255, 70_000 + i, dtype=np.uint8)) for i in range(8)]
        res = a.put_from_many([f"dev/b{i}" for i in range(8)], blocks)
        assert all(r.ok for r in res), [r.error for r in res if not r.ok]
        outs = [_FakeCudaTensor(np.zeros(70_000 + i, np.uint8)) for i in range(8)]
        got = b.get_into_many([f"dev/b{i}" for i in range(8)] + ["dev/none"],
                              outs + [_FakeCudaTensor(np.zeros(10, np.uint8))])
        assert all(r.ok for r in got[:8]) and not got[8].ok
        assert all((o.array == t.array).all() for o, t in zip(outs, blocks))
        assert a._cuda.calls.count("to_region") == 9 and b._cuda.calls.count("from_region") == 9
        with pytest.raises(OutOfRange):
            b.get_into("dev/x", _FakeCudaTensor(np.zeros(10, np.float16)))
        with pytest.raises(InvalidArgument, match="contiguous"):
            a.put_from("dev/nc", _FakeCudaTensor(np.zeros(10), contiguous=False))
        with pytest.raises(AlreadyExists):
            a.put_from("dev/x", x)
    cluster.assert_invariants()


def test_device_tensor_replicas(make_cluster, monkeypatch) -> None:
    """Two replicas: the tensor is copied into both extents and hashed once."""
    import cxlkv.client._client as client_mod
    import cxlkv.client._paths as paths_mod

    monkeypatch.setattr(paths_mod, "is_cuda_tensor", lambda o: isinstance(o, _FakeCudaTensor))
    monkeypatch.setattr(client_mod, "CudaCopier", _FakeCopier)
    cl = make_cluster(segments=2)
    with cl.client(0) as a, cl.client(1, direct=False) as d:
        x = _FakeCudaTensor(np.arange(100_000, dtype=np.uint8))
        a.put_from("rep/x", x, replica_num=2)
        assert d.get("rep/x") == x.array.tobytes()
        assert a._cuda.calls == ["to_region", "to_region"]
        (e,) = cl.list_master_keys()
        assert e.replica_count == 2
    cl.assert_invariants()
