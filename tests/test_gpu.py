"""CUDA tensors in direct mode (issue #10): DMA between the GPU and the region.

Every test but the first needs torch with a CUDA device and is skipped cleanly
without one (run them on a GPU machine: bench/gpu_device_run.sh runs this file
and ``cxlkv bench gpu``).
"""

from __future__ import annotations

import numpy as np
import pytest

from cxlkv.client._cuda import CudaCopier, cuda_available, is_cuda_tensor
from cxlkv.errors import InvalidArgument

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
