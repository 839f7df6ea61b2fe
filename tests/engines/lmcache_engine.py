"""A full ``LMCacheEngine`` (LMCache 0.5.6) storing and retrieving through cxlkv.

Run as ``lmcache_remote.py`` is (``CXLKV_AS_MOONCAKE=1``, ``CXLKV_SOCKET``)::

    python tests/engines/lmcache_engine.py store PREFIX TOKENS
    python tests/engines/lmcache_engine.py retrieve PREFIX TOKENS

LMCache's own engine — token database (chunk hashing), storage manager,
LocalCPUBackend, and RemoteBackend on ``mooncakestore://`` — with one piece
written here: the connector to the serving engine's KV cache. LMCache's
connectors copy from paged GPU memory with its CUDA kernels; this one is the
same interface over a CPU tensor ``[2, layers, tokens, hidden]`` (LMCache's
``KV_2LTD`` layout), copying with ``Tensor.copy_``. ``store`` fills the cache
with values derived from PREFIX, stores TOKENS tokens and waits until the
remote backend holds them; ``retrieve`` (another process, another clientd)
starts with a zeroed cache, retrieves, and compares every byte. One JSON line.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from typing import Any

import torch

from lmcache.v1.cache_engine import LMCacheEngineBuilder
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
from lmcache.v1.metadata import LMCacheMetadata

LAYERS, HEADS, HEAD_DIM, CHUNK = 4, 8, 64, 256
MODEL = "cxlkv/engine-test"


class CpuKVConnector(GPUConnectorInterface):
    """LMCache's connector interface over a CPU KV cache ``[2, LAYERS, tokens, HEADS * HEAD_DIM]``."""

    def __init__(self, kv: torch.Tensor) -> None:
        self.kv = kv
        self.kvcaches = None

    def from_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        memory_obj.tensor.copy_(self.kv[:, :, start:end, :])

    def to_gpu(self, memory_obj: Any, start: int, end: int, **kwargs: Any) -> None:
        self.kv[:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs: Any, starts: Any, ends: Any, **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(obj, s, e)

    def batched_to_gpu(self, memory_objs: Any = None, starts: Any = None, ends: Any = None, **kwargs: Any) -> None:
        for obj, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(obj, s, e)

    def get_shape(self, num_tokens: int) -> torch.Size:
        return torch.Size([2, LAYERS, num_tokens, HEADS * HEAD_DIM])


def expected(prefix: str, tokens: int) -> torch.Tensor:
    seed = int.from_bytes(hashlib.blake2b(prefix.encode(), digest_size=7).digest(), "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randn((2, LAYERS, tokens, HEADS * HEAD_DIM), generator=g).to(torch.bfloat16)


def main() -> int:
    role, prefix, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=True, max_local_cpu_size=1.0, save_unfull_chunk=True,
        remote_url="mooncakestore://127.0.0.1:50051/", remote_serde="naive",
        extra_config={"local_hostname": f"lmcache-{role}", "metadata_server": "P2PHANDSHAKE",
                      "protocol": "tcp", "global_segment_size": 64 << 20, "local_buffer_size": 64 << 20,
                      "master_server_address": "127.0.0.1:50051", "transfer_timeout": 10})
    metadata = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD_DIM), chunk_size=CHUNK)
    kv = expected(prefix, n) if role == "store" else torch.zeros((2, LAYERS, n, HEADS * HEAD_DIM),
                                                                  dtype=torch.bfloat16)
    engine = LMCacheEngineBuilder.get_or_create(f"cxlkv-{role}", config, metadata, CpuKVConnector(kv),
                                                lambda t, r: None, lambda o, r: o)
    engine.post_init()  # what the serving-engine adapter calls once its KV caches are registered
    tokens = torch.arange(n, dtype=torch.long) + len(prefix) * 7919  # the prompt's token ids
    t0 = time.perf_counter()
    out: dict[str, Any] = {"role": role, "tokens": n}
    if role == "store":
        engine.store(tokens)
        deadline = time.monotonic() + 60
        while engine.lookup(tokens, search_range=["RemoteBackend"]) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        out["remote_hit_tokens"] = engine.lookup(tokens, search_range=["RemoteBackend"])
        ok = out["remote_hit_tokens"] == n
    else:
        out["lookup_tokens"] = engine.lookup(tokens)
        mask = engine.retrieve(tokens)
        out["retrieved_tokens"] = int(mask.sum().item())
        ok = out["retrieved_tokens"] == n and torch.equal(kv.view(torch.int16), expected(prefix, n).view(torch.int16))
    out["bit_exact" if role == "retrieve" else "stored"] = bool(ok)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(out))
    LMCacheEngineBuilder.destroy(f"cxlkv-{role}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
