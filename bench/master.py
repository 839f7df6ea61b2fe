"""``cxlkv bench master``: the master's metadata path and its allocator.

Measured over a real master subprocess and real gRPC (one client process, sync
stubs, ``inflight`` batches in flight at once for the batched forms), and again
over the master's lean link (``transport: "lean"``, what clientd uses on its hot
path) for the batched forms:

* ``put``: PutStart + PutEnd per key, one key per call pair;
* ``put_batch``: a batched put of ``batch`` (128) keys: PutStart + PutEnd with
  one packed array per field (``form: "packed"``, what clientd sends; the
  one-message-per-key form of older results, ``form: "items"``, is gone from the
  master's API);
* ``get``: GetReplicaList (with a lease) per key;
* ``get_batch``: GetReplicaList of 128 keys, releasing the previous
  batch's leases piggy-backed (what clientd does);

and in-process (the allocator never touches bytes, so a huge virtual segment is
fine):

* ``alloc`` / ``free``: the allocator at about 1,000,000 live extents of mixed
  sizes (log-uniform 4 KiB–64 MiB), churning at full: free a random extent,
  allocate a new random size; when an allocation fails, free random extents
  until it fits. ``utilisation`` is used/capacity at the moments allocations
  failed (mean; ``utilisation_min`` the worst), i.e. how full the segment gets
  before the mix stops fitting.

For the gRPC records ``ops_per_s`` counts keys, ``gbps`` is 0 (no bytes move
through the master) and ``limit_gbps`` is None; the limit is
``limit_ops_per_s``, the same state operations called in-process without gRPC,
and ``ratio_to_limit`` = ops_per_s / limit_ops_per_s. Latencies are per call
(per batch for the batched forms). ``target_*`` fields carry the issue's
targets and ``meets_target`` whether this run met them.
"""

from __future__ import annotations

import gc
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import click
import numpy as np
import tomli_w

from cxlkv.bench.common import Record, Timing, emit, output_options

__all__ = ["master_cmd", "run"]

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40

#: The issue's targets.
TARGET_BATCH_PUT_KEYS_PER_S = 50_000
TARGET_ALLOC_P99_US = 20.0
TARGET_UTILISATION = 0.95

_VALUE_BYTES = 64 * KiB
_SEGMENT_BYTES = 64 * TiB  # virtual: the master never touches bytes


# ----------------------------------------------------------------- master process

class _Master:
    """A master subprocess with a huge virtual segment, and a sync stub on it."""

    def __init__(self, run_dir: Path, *, tls: bool = False) -> None:
        from cxlkv.deploy.cluster import ManagedProcess, wait_for_file

        address_file = run_dir / "master.address"
        conf = run_dir / "master.toml"
        cfg: dict[str, Any] = {
            "listen_address": "127.0.0.1:0", "address_file": str(address_file),
            "log_level": "warning", "lease_ttl_s": 30.0,
            "segments": [{"name": "cxl0", "size_bytes": _SEGMENT_BYTES}],
        }
        #: The bench client's TLS files (``None``: plaintext).
        self.tls: Any = None
        if tls:
            from cxlkv.deploy.certs import local_cluster_certs
            from cxlkv.wire.tls import TlsFiles

            certs = local_cluster_certs(run_dir / "certs", ["bench"])
            ca = certs["ca"][0]
            cfg.update(tls_ca_file=ca, tls_cert_file=certs["master"][0], tls_key_file=certs["master"][1])
            self.tls = TlsFiles(ca, *certs["bench"])
        conf.write_text(tomli_w.dumps(cfg))
        self.proc = ManagedProcess("master", [sys.executable, "-m", "cxlkv.cli", "master", "--config", str(conf)],
                                   run_dir / "master.log")
        self.proc.start()
        wait_for_file(address_file, 60.0, self.proc)
        import grpc

        from cxlkv.v1 import master_pb2, master_pb2_grpc

        self.address = address_file.read_text().strip()
        if self.tls is not None:
            from cxlkv.wire.tls import grpc_channel_credentials

            self.channel = grpc.secure_channel(self.address, grpc_channel_credentials(self.tls))
        else:
            self.channel = grpc.insecure_channel(self.address)
        self.stub = master_pb2_grpc.MasterServiceStub(self.channel)
        reg = self.stub.RegisterClient(master_pb2.RegisterClientRequest(hostname="bench", name="bench"))
        self.client_id, self.epoch = reg.client_id, reg.epoch
        self._heartbeat_at = time.monotonic()

    def heartbeat(self) -> None:
        from cxlkv.v1 import master_pb2

        if time.monotonic() - self._heartbeat_at > 1.0:
            self.stub.Heartbeat(master_pb2.HeartbeatRequest(client_id=self.client_id, epoch=self.epoch))
            self._heartbeat_at = time.monotonic()

    def close(self) -> None:
        self.channel.close()
        self.proc.stop()


def _timing(runs: list[tuple[float, int, np.ndarray]]) -> Timing:
    """Combine ``(wall_s, ops, per-call latency ns)`` runs: median rate, pooled percentiles."""
    rates = tuple(n / wall for wall, n, _ in runs)
    lat_us = np.concatenate([lat for _, _, lat in runs]) / 1e3
    p50, p99 = np.percentile(lat_us, [50, 99])
    return Timing(ops_per_s=statistics.median(rates), p50_us=float(p50), p99_us=float(p99),
                  run_ops_per_s=rates, ops_per_run=runs[0][1])


def _threaded(jobs: list[Any], work: Callable[[Any], None], threads: int) -> tuple[float, np.ndarray]:
    """Run ``work(job)`` for every job on ``threads`` threads (each job one timed
    unit, e.g. one batch); returns (wall seconds, per-job latency ns)."""
    lat = np.empty(len(jobs), dtype=np.int64)
    clock = time.perf_counter_ns

    def worker(idx: range) -> None:
        for i in idx:
            t = clock()
            work(jobs[i])
            lat[i] = clock() - t

    t0 = clock()
    if threads == 1:
        worker(range(len(jobs)))
    else:
        with ThreadPoolExecutor(threads) as pool:
            for f in [pool.submit(worker, range(k, len(jobs), threads)) for k in range(threads)]:
                f.result()
    return (clock() - t0) / 1e9, lat


def _packed_put_requests(cid: str, epoch: int) -> tuple[Callable[[list[str]], Any], Callable[[list[str], Any], Any]]:
    """Builders of a packed batched put: ``start(keys)`` and ``end(keys, start_response)``
    (the latter raises RuntimeError on a failed start position)."""
    from cxlkv.v1 import master_pb2

    def start(keys: list[str]) -> Any:
        n = len(keys)
        return master_pb2.PutStartRequest(
            client_id=cid, epoch=epoch, keys=keys, value_size_bytes=[_VALUE_BYTES] * n)

    def end(keys: list[str], started: Any) -> Any:
        if started.error_positions:
            i = started.error_positions[0]
            raise RuntimeError(f"PutStart {keys[i]}: {started.messages[0]}")
        return master_pb2.PutEndRequest(client_id=cid, epoch=epoch, keys=keys, put_tokens=started.put_tokens)

    return start, end


def _check_packed_end(done: Any) -> None:
    if done.error_positions:
        raise RuntimeError(f"PutEnd: {done.messages[0]}")


def _put_work(m: _Master, batch: int) -> Callable[[list[str]], None]:
    """One put call pair per job (``batch`` keys: 1 for the per-key record)."""
    stub = m.stub
    start, end = _packed_put_requests(m.client_id, m.epoch)

    def put(keys: list[str]) -> None:
        _check_packed_end(stub.PutEnd(end(keys, stub.PutStart(start(keys)))))
    return put


def _get_work(m: _Master, batch: int) -> Callable[[list[str]], None]:
    from cxlkv.v1 import master_pb2

    stub, cid = m.stub, m.client_id
    if batch == 1:
        def get_one(keys: list[str]) -> None:
            # One call per key; its lease ends by TTL (clientd would piggy-back the release).
            resp = stub.GetReplicaList(master_pb2.GetReplicaListRequest(client_id=cid, keys=keys))
            if resp.error_positions:
                raise RuntimeError(f"GetReplicaList: {resp.messages[0]}")
        return get_one

    mine = threading.local()  # each caller releases its own previous batch's leases

    def get_batch(keys: list[str]) -> None:
        held = getattr(mine, "held", [])
        resp = stub.GetReplicaList(master_pb2.GetReplicaListRequest(
            client_id=cid, keys=keys, release_lease_ids=held))
        if resp.error_positions:
            raise RuntimeError(f"GetReplicaList: {resp.messages[0]}")
        mine.held = list(resp.lease_ids)
    return get_batch


def _grpc_records(quick: bool, log: Callable[[str], None] = lambda _m: None) -> list[Record]:
    n_single = 1000 if quick else 4000
    n_batched = 128 * (40 if quick else 400)
    runs = 2 if quick else 3
    log(f"  the state machine's own rate, in process ({n_batched:,} keys: the limit beside each figure)")
    limits = _state_limits(n_batched)
    out: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="cxlkv-bench-master-") as tmp:
        m = _Master(Path(tmp))
        try:
            for op, batch, threads, n, form in (
                    ("put", 1, 1, n_single, "single"), ("put_batch", 128, 1, n_batched, "packed"),
                    ("put_batch", 128, 2, n_batched, "packed"), ("put_batch", 128, 4, n_batched, "packed")):
                res = []
                for r in range(runs):
                    m.heartbeat()
                    keys = [f"{op}/{form}/{threads}/{r}/{i}" for i in range(n)]
                    jobs = [keys[i:i + batch] for i in range(0, n, batch)]
                    wall, lat = _threaded(jobs, _put_work(m, batch), threads)
                    res.append((wall, n, lat))
                rec = _record(op, _timing(res), batch, threads, limits["put"],
                              TARGET_BATCH_PUT_KEYS_PER_S if batch > 1 else None)
                rec.extra["form"] = form
                out.append(rec)
                log(f"  grpc {op} batch {batch} threads {threads} ({form}): {rec.ops_per_s:,.0f} keys/s")
            keys = [f"put_batch/packed/1/0/{i}" for i in range(n_batched)]
            for op, batch, threads, n in (("get", 1, 1, n_single), ("get_batch", 128, 1, n_batched),
                                          ("get_batch", 128, 4, n_batched)):
                res = []
                for _ in range(runs):
                    m.heartbeat()
                    jobs = [keys[i:i + batch] for i in range(0, n, batch)]
                    wall, lat = _threaded(jobs, _get_work(m, batch), threads)
                    res.append((wall, n, lat))
                out.append(_record(op, _timing(res), batch, threads, limits["get"], None))
                log(f"  grpc {op} batch {batch} threads {threads}: {out[-1].ops_per_s:,.0f} keys/s")
        finally:
            m.close()
    return out


def _record(op: str, timing: Timing, batch: int, threads: int, limit: float,
            target: float | None, transport: str = "grpc") -> Record:
    rec = Record(
        bench="master", op=op, size_bytes=_VALUE_BYTES, ops_per_s=timing.ops_per_s, gbps=0.0,
        p50_us=timing.p50_us, p99_us=timing.p99_us, limit_gbps=None,
        ratio_to_limit=timing.ops_per_s / limit if limit else None,
        extra={"batch": batch, "inflight": threads, "unit": "keys", "limit_ops_per_s": limit,
               "latency_per": "batch" if batch > 1 else "key", "transport": transport},
    )
    if target is not None:
        rec.extra["target_ops_per_s"] = target
        rec.extra["meets_target"] = timing.ops_per_s >= target
    return rec


# -------------------------------------------------------------- in-process limits

def _state_limits(n: int) -> dict[str, float]:
    """Keys per second of the same state operations without gRPC (best of 3)."""
    from cxlkv.config import MasterConfig, SegmentConfig
    from cxlkv.master.state import MasterState

    st = MasterState(MasterConfig(segments=[SegmentConfig(name="cxl0", size_bytes=_SEGMENT_BYTES)],
                                  lease_ttl_s=30.0))
    c = st.register_client("bench", "bench", os.getpid(), [], "", "", 0.0)
    cid, epoch = c.client_id, c.epoch
    put_rates, get_rates = [], []
    for r in range(3):
        keys = [f"k/{r}/{i}" for i in range(n)]
        t0 = time.perf_counter()
        for k in keys:
            obj = st.put_start(cid, epoch, k, _VALUE_BYTES, 0.0)
            st.put_end(cid, epoch, k, obj.version, 0.0)
        put_rates.append(n / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        held: list[int] = []
        for k in keys:
            _, lease = st.get(cid, k, 0.0)
            held.append(lease.lease_id)
        st.release_leases(cid, held)
        get_rates.append(n / (time.perf_counter() - t0))
    return {"put": max(put_rates), "get": max(get_rates)}


# ---------------------------------------------------------------------- allocator

def _bench_allocator(live_target: int, churn_ops: int, seed: int = 1) -> list[Record]:
    """Allocator at ``live_target`` live extents (see the module docstring)."""
    from cxlkv.master.allocator import ExtentAllocator
    from cxlkv.layout.region import REGION_HEADER_BYTES

    rng = random.Random(seed)
    lo, hi = math.log(4 * KiB), math.log(64 * MiB)
    draw = [int(math.exp(rng.uniform(lo, hi))) for _ in range(int(live_target * 1.05) + churn_ops * 2)]
    # Sized so that the fill stops a little above live_target and the churn
    # (which frees one more extent per failed allocation) ends near it.
    capacity = sum(draw[:int(live_target * 1.05)])
    alloc = ExtentAllocator(REGION_HEADER_BYTES, REGION_HEADER_BYTES + capacity, 64)
    live: list[int] = []
    it = iter(draw)
    for size in it:  # fill until the first failure: about live_target extents
        off = alloc.alloc(size)
        if off < 0:
            break
        live.append(off)
    clock = time.perf_counter_ns
    a_lat = np.empty(churn_ops * 2, dtype=np.int64)
    f_lat = np.empty(churn_ops * 2, dtype=np.int64)
    na = nf = 0
    utils: list[float] = []
    churn = rng.randrange
    t_alloc = t_free = 0
    for _ in range(churn_ops):
        size = next(it)
        j = churn(len(live))
        off = live[j]
        live[j] = live[-1]
        live.pop()
        t = clock()
        alloc.free(off)
        d = clock() - t
        f_lat[nf] = d
        nf += 1
        t_free += d
        while True:
            t = clock()
            off = alloc.alloc(size)
            d = clock() - t
            a_lat[na] = d
            na += 1
            t_alloc += d
            if off >= 0:
                break
            utils.append(alloc.used_bytes / alloc.capacity_bytes)
            j = churn(len(live))
            victim = live[j]
            live[j] = live[-1]
            live.pop()
            t = clock()
            alloc.free(victim)
            d = clock() - t
            if nf < len(f_lat):
                f_lat[nf] = d
                nf += 1
                t_free += d
        live.append(off)
    util = statistics.mean(utils) if utils else alloc.used_bytes / alloc.capacity_bytes
    util_min = min(utils) if utils else util
    mean_size = int(statistics.mean(draw[:live_target]))
    out = []
    for op, lat, n, total in (("alloc", a_lat[:na], na, t_alloc), ("free", f_lat[:nf], nf, t_free)):
        p50, p99 = np.percentile(lat / 1e3, [50, 99])
        rec = Record(bench="master", op=op, size_bytes=mean_size, ops_per_s=n / (total / 1e9), gbps=0.0,
                     p50_us=float(p50), p99_us=float(p99), limit_gbps=None, ratio_to_limit=None,
                     extra={"live_objects": len(live), "sizes": "4KiB-64MiB log-uniform",
                            "utilisation": round(util, 4), "utilisation_min": round(util_min, 4),
                            "alloc_failures": len(utils), "free_blocks": alloc.free_blocks})
        if op == "alloc":
            rec.extra["target_p99_us"] = TARGET_ALLOC_P99_US
            rec.extra["target_utilisation"] = TARGET_UTILISATION
            rec.extra["meets_target"] = bool(p99 <= TARGET_ALLOC_P99_US and util >= TARGET_UTILISATION)
        out.append(rec)
    return out


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _lean_records(quick: bool, tls: bool = False, log: Callable[[str], None] = lambda _m: None) -> list[Record]:
    """Batched puts and gets over the master's lean link (what clientd uses): an
    asyncio :class:`~cxlkv.wire.lean.LeanChannel`, ``inflight`` batches in flight;
    with ``tls`` over mutual TLS (generated certificates; ``extra["tls"]``)."""
    import asyncio

    from cxlkv.wire.lean import LeanChannel, service_methods
    from cxlkv.v1 import master_pb2

    methods = service_methods(master_pb2.DESCRIPTOR.services_by_name["MasterService"])
    batch = 128
    n = batch * (40 if quick else 400)
    runs = 2 if quick else 3
    limits = _state_limits(n)
    out: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="cxlkv-bench-master-") as tmp:
        m = _Master(Path(tmp), tls=tls)
        ssl_ctx = None
        if m.tls is not None:
            from cxlkv.wire.tls import client_context

            ssl_ctx = client_context(m.tls)
        try:
            reg = m.stub.RegisterClient(master_pb2.RegisterClientRequest(hostname="bench", name="lean"))
            cid, epoch = reg.client_id, reg.epoch
            host = m.address.rsplit(":", 1)[0]

            start, end = _packed_put_requests(cid, epoch)

            async def put_batch(ch: LeanChannel, keys: list[str]) -> None:
                started = await ch.call("PutStart", start(keys))
                _check_packed_end(await ch.call("PutEnd", end(keys, started)))

            held: dict[int, list[int]] = {}
            #: (master CPU s, this process's CPU s, keys) per timed run: what TLS costs
            #: each side, steadier than rates on a shared machine.
            cpu_used: list[tuple[float, float, int]] = []

            def add_cpu(rec: Record) -> Record:
                rec.extra["master_cpu_us_per_key"] = round(statistics.median(m_ / n_ * 1e6 for m_, _, n_ in cpu_used), 3)
                rec.extra["client_cpu_us_per_key"] = round(statistics.median(c_ / n_ * 1e6 for _, c_, n_ in cpu_used), 3)
                cpu_used.clear()
                return rec

            async def get_batch(ch: LeanChannel, keys: list[str], lane: int) -> None:
                resp = await ch.call("GetReplicaList", master_pb2.GetReplicaListRequest(
                    client_id=cid, keys=keys, release_lease_ids=held.get(lane, [])))
                held[lane] = [lease for lease in resp.lease_ids if lease]

            async def timed(jobs: list[list[str]], inflight: int, work: Any) -> tuple[float, int, np.ndarray]:
                ch = LeanChannel(host, reg.lean_port, methods, ssl=ssl_ctx)
                lat = np.empty(len(jobs), dtype=np.int64)
                clock = time.perf_counter_ns

                async def lane(k: int) -> None:
                    for i in range(k, len(jobs), inflight):
                        t = clock()
                        await work(ch, jobs[i], k)
                        lat[i] = clock() - t

                cpu0 = _cpu_s(m.proc.pid), time.process_time()
                t0 = clock()
                await asyncio.gather(*(lane(k) for k in range(inflight)))
                wall = (clock() - t0) / 1e9
                cpu_used.append((_cpu_s(m.proc.pid) - cpu0[0], time.process_time() - cpu0[1],
                                 sum(len(j) for j in jobs)))
                ch.close()
                return wall, sum(len(j) for j in jobs), lat

            for inflight in (1, 4):
                res = []
                for r in range(runs):
                    m.heartbeat()
                    keys = [f"lean/{inflight}/{r}/{i}" for i in range(n)]
                    jobs = [keys[i:i + batch] for i in range(0, n, batch)]
                    res.append(asyncio.run(timed(jobs, inflight, lambda ch, ks, _k: put_batch(ch, ks))))
                rec = _record("put_batch", _timing(res), batch, inflight, limits["put"],
                              TARGET_BATCH_PUT_KEYS_PER_S, transport="lean")
                rec.extra["form"] = "packed"
                out.append(add_cpu(rec))
                log(f"  lean{' tls' if tls else ''} put_batch in flight {inflight}: {rec.ops_per_s:,.0f} keys/s")
            keys = [f"lean/1/0/{i}" for i in range(n)]
            jobs = [keys[i:i + batch] for i in range(0, n, batch)]
            res = [asyncio.run(timed(jobs, 4, get_batch)) for _ in range(runs)]
            out.append(add_cpu(_record("get_batch", _timing(res), batch, 4, limits["get"], None, transport="lean")))
            log(f"  lean{' tls' if tls else ''} get_batch in flight 4: {out[-1].ops_per_s:,.0f} keys/s")
        finally:
            m.close()
    for rec in out:
        rec.extra["tls"] = tls
    return out


def run(quick: bool = False, log: Callable[[str], None] | None = None) -> list[Record]:
    """Every master measurement; ``quick`` shrinks them to a smoke run. The lean
    link is measured plaintext and over mutual TLS, in the same run.

    Args:
        log: progress lines (one per phase and per measurement), e.g. to stderr.
    """
    t0 = time.monotonic()

    def say(msg: str) -> None:
        if log is not None:
            log(f"[{time.monotonic() - t0:6.1f} s] {msg}")

    say("master over gRPC (5 put and 3 get measurements)")
    records = _grpc_records(quick, say)
    say("master over the lean link, plaintext")
    records += _lean_records(quick, log=say)
    say("master over the lean link, mutual TLS")
    records += _lean_records(quick, tls=True, log=say)
    gc.collect()
    n = 100_000 if quick else 1_000_000
    say(f"allocator with {n:,} live objects")
    records += _bench_allocator(n, 20_000 if quick else 200_000)
    say("done")
    return records


@click.command("master")
@output_options
def master_cmd(as_json: bool, out: str | None, quick: bool) -> None:
    """Master metadata ops over gRPC (batches of one key and of 128) and the allocator at 1M objects."""
    emit(run(quick, log=lambda m: click.echo(m, err=True)), as_json=as_json, out=out)
