"""LMCache's own ``mooncakestore://`` remote backend on cxlkv, as an engine runs it.

Run in an environment with LMCache and cxlkv's SDK (``make test-engines`` makes
one), with ``CXLKV_AS_MOONCAKE=1`` and the import hook's ``.pth`` installed, and
``CXLKV_SOCKET`` naming this "host"'s clientd::

    python tests/engines/lmcache_remote.py put PREFIX CHUNKS CHUNK_TOKENS
    python tests/engines/lmcache_remote.py get PREFIX CHUNKS CHUNK_TOKENS

``put`` stores CHUNKS KV chunks (CHUNK_TOKENS tokens each, 4 layers × K/V × 8
heads × 64 dims of bfloat16: 8 KiB a token) through LMCache's LocalCPUBackend
and RemoteBackend, configured from LMCache's own ``remote_url`` and
``extra_config`` (the ``mooncake_*`` keys go to ``setup(dict)``). ``get`` reads
them back through a new RemoteBackend — run it against another clientd to
cross hosts — and checks every byte against the values ``put`` derived from
the same seed. Each prints one JSON line; exit 0 means every chunk matched.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
import time

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.remote_backend import RemoteBackend

LAYERS, HEADS, HEAD_DIM = 4, 8, 64
MODEL = "cxlkv/engine-test"


def _seed(prefix: str, i: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{prefix}/{i}".encode(), digest_size=7).digest(), "little")


def chunk_values(prefix: str, i: int, tokens: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(_seed(prefix, i))
    return torch.randn((LAYERS, 2, tokens, HEADS * HEAD_DIM), generator=g).to(torch.bfloat16)


def main() -> int:
    role, prefix, chunks, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    config = LMCacheEngineConfig.from_defaults(
        chunk_size=tokens, local_cpu=True, max_local_cpu_size=1.0,
        remote_url="mooncakestore://127.0.0.1:50051/", remote_serde="naive",
        extra_config={"local_hostname": f"lmcache-{role}", "metadata_server": "P2PHANDSHAKE",
                      "protocol": "tcp", "global_segment_size": 64 << 20, "local_buffer_size": 64 << 20,
                      "master_server_address": "127.0.0.1:50051", "transfer_timeout": 10})
    metadata = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0,
                               local_worker_id=0, kv_dtype=torch.bfloat16,
                               kv_shape=(LAYERS, 2, tokens, HEADS, HEAD_DIM), chunk_size=tokens)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    local = LocalCPUBackend(config, metadata, dst_device="cpu")
    remote = RemoteBackend(config, metadata, loop, local, dst_device="cpu")
    if remote.connection is None:
        print(json.dumps({"role": role, "error": "LMCache could not create its Mooncake connector"}))
        return 1
    shape = torch.Size((LAYERS, 2, tokens, HEADS * HEAD_DIM))
    keys = [CacheEngineKey(MODEL, 1, 0, _seed(prefix, i), torch.bfloat16)
            for i in range(chunks)]
    t0 = time.perf_counter()
    matched = 0
    if role == "put":
        for i, key in enumerate(keys):
            obj = local.allocate(shape, torch.bfloat16, MemoryFormat.KV_2LTD)
            obj.tensor.copy_(chunk_values(prefix, i, tokens))
            remote.submit_put_task(key, obj).result(timeout=60)
            obj.ref_count_down()
        matched = sum(1 for key in keys if remote.contains(key))
    else:
        for i, obj in enumerate(remote.batched_get_blocking(keys)):
            if obj is None:
                continue
            got = obj.tensor.view(torch.bfloat16).reshape(shape)
            if torch.equal(got.view(torch.int16), chunk_values(prefix, i, tokens).view(torch.int16)):
                matched += 1
            obj.ref_count_down()
    dt = time.perf_counter() - t0
    chunk_bytes = LAYERS * 2 * tokens * HEADS * HEAD_DIM * 2
    print(json.dumps({"role": role, "chunks": chunks, "matched": matched, "chunk_bytes": chunk_bytes,
                      "seconds": round(dt, 3), "store": sys.modules["mooncake.store"].MooncakeDistributedStore.__module__}))
    remote.close()
    loop.call_soon_threadsafe(loop.stop)
    return 0 if matched == chunks else 1


if __name__ == "__main__":
    sys.exit(main())
