"""``cxlkv bench gpu``: CUDA tensors to and from the CXL region in direct mode.

One master and two clientds on a pre-faulted ``/dev/shm`` region; one process
(with the GPU) writes through clientd A and reads through clientd B, both in
direct mode: the GPU's copy engines DMA between the tensor and the region
mapping, which the SDK registers with CUDA (``cudaHostRegister``) on first use.
Measured, for 1 MiB, 16 MiB and 256 MiB values, single (``batch`` 1: ``put_from``
/ ``get_into``) and batched (``batch`` 32: ``put_from_many`` / ``get_into_many``
of 32 blocks):

* ``path = "direct"``: registered region (the fast path);
* ``path = "direct_unregistered"``: the same calls with ``cuda_register=False``
  (the driver stages each copy through its own pinned buffer);
* ``path = "pinned_copy"``: a plain ``Tensor.copy_`` between the GPU and a pinned
  host buffer of the same size on one stream (GPU → host for ``put``, host → GPU
  for ``get``) — the PCIe limit, measured in the same run.

``limit_gbps`` of every record is the pinned copy of the same size, direction
and batch; ``ratio_to_limit`` = GB/s / that. Every put and get includes the
daemon's metadata calls, the xxh3_64 checksum (put: hashed from the region as
each chunk's DMA lands; get: hashed on the CPU while the GPU copies) and the
header check. Records carry ``device`` (the GPU's name) and ``coherence``.

Without CUDA (no torch, or no device) it prints one line saying so and exits 0
(``--json``: an empty list).

Must show (issue #10): put and get of >= 16 MiB tensors each >= 0.85x the pinned
copy of the same run (``path = "direct"``).
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any, Callable

import click
import numpy as np

from cxlkv.bench.common import Record, Timing, emit, output_options, run_once

__all__ = ["run_gpu", "must_show_failures", "gpu_cmd", "SIZES", "BATCH"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: Value sizes, bytes.
SIZES = [1 * MiB, 16 * MiB, 256 * MiB]
QUICK_SIZES = [1 * MiB, 16 * MiB]
#: Blocks per batched call.
BATCH = 32
BENCH = "gpu"


def _region_bytes(sizes: list[int]) -> int:
    """Room for one run's keys (at most 1 GiB, or one batch of the largest size), plus headers."""
    return max(2 * GiB, BATCH * max(sizes) + 1 * GiB)


def _timed(fn: Callable[[int], None], ops: int, runs: int) -> Timing:
    """``fn(i)`` for ``ops`` calls per run, after one warm-up call; ``runs`` runs."""
    fn(-1)
    out = []
    for r in range(runs):
        lat = np.empty(ops, dtype=np.int64)
        clock = time.perf_counter_ns
        start = prev = clock()
        for i in range(ops):
            fn(r * ops + i)
            now = clock()
            lat[i] = now - prev
            prev = now
        out.append(((prev - start) / 1e9, lat))
    return Timing.from_runs(out)


def run_gpu(*, quick: bool = False, log: Callable[[str], None] = lambda m: None,
            coherence: str = "coherent") -> list[Record]:
    """Run the benchmark; returns the records (empty when CUDA is unavailable).

    Raises:
        RuntimeError: direct mode is unavailable or a call failed.
        cxlkv.deploy.cluster.ClusterError: the cluster did not start.
    """
    from cxlkv.client._cuda import cuda_available

    if not cuda_available():
        return []
    import torch

    from cxlkv import Client
    from cxlkv.deploy.cluster import LocalCluster

    sizes = QUICK_SIZES if quick else SIZES
    runs = 2 if quick else 3
    dev = torch.device("cuda", torch.cuda.current_device())
    device_name = torch.cuda.get_device_name(dev)
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="cxlkv-bench-gpu-") as tmp:
        region = _region_bytes(sizes)
        log(f"starting a cluster (1 master, 2 clientds, {region >> 20} MiB region, prefaulted, {coherence}); "
            f"GPU {device_name}")
        cluster = LocalCluster(tmp, clientds=2, region_size_bytes=region,
                               clientd_options={"prefault": True, "coherence": coherence}, start_timeout_s=300)
        cluster.start()
        try:
            clients = {
                "direct": (Client(cluster.socket_path(0), direct_threshold_bytes=0, direct_prefault=True),
                           Client(cluster.socket_path(1), direct_threshold_bytes=0, direct_prefault=True)),
                "direct_unregistered": (
                    Client(cluster.socket_path(0), direct_threshold_bytes=0, cuda_register=False),
                    Client(cluster.socket_path(1), direct_threshold_bytes=0, cuda_register=False)),
            }
            for w, r in clients.values():
                if not (w.direct and r.direct):
                    raise RuntimeError(f"direct mode unavailable: {w.direct_status}; {r.direct_status}")
            try:
                for size in sizes:
                    for batch in (1, BATCH):
                        records += _measure(size, batch, runs, clients, dev, device_name, coherence, log)
            finally:
                for w, r in clients.values():
                    w.close()
                    r.close()
        finally:
            killed = cluster.stop()
            if killed:
                log(f"warning: processes had to be killed at the end: {killed}")
    return records


def _measure(size: int, batch: int, runs: int, clients: dict[str, tuple[Any, Any]], dev: Any,
             device_name: str, coherence: str, log: Callable[[str], None]) -> list[Record]:
    import torch

    total = size * batch
    ops = max(1, min(50, (1 * GiB) // total))  # calls per run: about 1 GiB, at least one call
    n_elems = size // 2
    src = [torch.randn(n_elems, dtype=torch.float16, device=dev) for _ in range(batch)]
    dst = [torch.empty(n_elems, dtype=torch.float16, device=dev) for _ in range(batch)]
    pinned = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(batch)]
    stream = torch.cuda.Stream(dev)
    out: list[Record] = []
    extra = {"batch": batch, "device": device_name, "coherence": coherence}

    # ---- the PCIe limit: pinned host <-> GPU, same sizes, one stream -----------
    def d2h(_: int) -> None:
        with torch.cuda.stream(stream):
            for s, p in zip(src, pinned):
                p.copy_(s.view(torch.uint8), non_blocking=True)
        stream.synchronize()

    def h2d(_: int) -> None:
        with torch.cuda.stream(stream):
            for d, p in zip(dst, pinned):
                d.view(torch.uint8).copy_(p, non_blocking=True)
        stream.synchronize()

    limit: dict[str, float] = {}
    for op, fn in (("put", d2h), ("get", h2d)):
        t = _timed(fn, ops, runs)
        rec = Record.from_timing(BENCH, op, size, _per_block(t, batch), None, path="pinned_copy", **extra)
        limit[op] = rec.gbps
        out.append(rec)
    torch.cuda.synchronize()

    # ---- direct mode, registered and not --------------------------------------
    for path, (writer, reader) in clients.items():
        tag = f"gpu/{path}/{size}/{batch}"

        def put(i: int, writer: Any = writer, tag: str = tag) -> None:
            keys = [f"{tag}/{i}/{j}" for j in range(batch)]
            if batch == 1:
                writer.put_from(keys[0], src[0])
            else:
                bad = [r.error for r in writer.put_from_many(keys, src) if not r.ok]
                if bad:
                    raise RuntimeError(f"put_from_many: {bad[0]!r}")

        last = (runs - 1) * ops  # the keys of the last put run stay for the gets

        def get(i: int, reader: Any = reader, tag: str = tag) -> None:
            keys = [f"{tag}/{last + i % ops}/{j}" for j in range(batch)]
            if batch == 1:
                if reader.get_into(keys[0], dst[0]) != size:
                    raise RuntimeError("get_into: wrong size")
            else:
                bad = [r.error for r in reader.get_into_many(keys, dst) if not r.ok]
                if bad:
                    raise RuntimeError(f"get_into_many: {bad[0]!r}")

        put(-1)  # warm-up: registers the region with CUDA
        writer.remove_all(regex=f"^{tag}/", force=True)
        put_runs = []
        for r in range(runs):
            ids = iter(range(r * ops, (r + 1) * ops))
            put_runs.append(run_once(lambda: put(next(ids)), ops))
            if r < runs - 1:
                writer.remove_all(regex=f"^{tag}/", force=True)
        put_t = Timing.from_runs(put_runs)
        gt = _timed(get, ops, runs)
        if not torch.equal(dst[0], src[0]):
            raise RuntimeError(f"{path}: read back wrong bytes for size {size}")
        writer.remove_all(regex=f"^{tag}/", force=True)
        for op, t in (("put", put_t), ("get", gt)):
            rec = Record.from_timing(BENCH, op, size, _per_block(t, batch), limit[op], path=path, **extra)
            out.append(rec)
    for rec in out:
        ratio = rec.ratio_to_limit if rec.ratio_to_limit is not None else 1.0
        log(f"  {rec.op:<4} {rec.size_bytes >> 20:>4} MiB x{batch:<3} {rec.extra['path']:<20} "
            f"{rec.gbps:7.2f} GB/s  ratio {ratio:.2f}")
    del src, dst, pinned
    torch.cuda.empty_cache()
    return out


def _per_block(t: Timing, batch: int) -> Timing:
    """A timing of calls moving ``batch`` blocks each, as blocks per second."""
    if batch == 1:
        return t
    return Timing(t.ops_per_s * batch, t.p50_us, t.p99_us, tuple(r * batch for r in t.run_ops_per_s),
                  t.ops_per_run * batch)


def must_show_failures(records: list[Record]) -> list[str]:
    """The issue's GPU targets these records miss: direct put/get of >= 16 MiB >= 0.85x pinned."""
    out = []
    for r in records:
        if r.extra.get("path") == "direct" and r.size_bytes >= 16 * MiB and (r.ratio_to_limit or 0) < 0.85:
            out.append(f"{r.op} {r.size_bytes >> 20} MiB batch {r.extra.get('batch')}: "
                       f"ratio_to_limit {r.ratio_to_limit:.2f} < 0.85")
    return out


@click.command("gpu")
@output_options
@click.option("--coherence", type=click.Choice(["coherent", "flush"]), default="coherent", show_default=True,
              help="The clientds' coherence mode (flush: the GPU-written range is flushed before PutEnd).")
@click.option("--check", is_flag=True, help="Exit 1 when a must-show target is missed.")
def gpu_cmd(as_json: bool, out: str | None, quick: bool, coherence: str, check: bool) -> None:
    """CUDA tensors <-> CXL region in direct mode, beside a pinned-buffer copy and the unregistered path."""
    from cxlkv.client._cuda import cuda_available
    from cxlkv.errors import CxlkvError

    if not cuda_available():
        click.echo("bench gpu: skipped: CUDA is not available here (torch is not installed or sees no GPU)",
                   err=True)
        emit([], as_json=as_json, out=out)
        return
    try:
        records = run_gpu(quick=quick, log=lambda m: click.echo(m, err=True), coherence=coherence)
    except (CxlkvError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    emit(records, as_json=as_json, out=out)
    failures = must_show_failures(records)
    for f in failures:
        click.echo(f"MISSED: {f}", err=True)
    if check and failures:
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    gpu_cmd()
