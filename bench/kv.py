"""``cxlkv bench kv``: end-to-end Put and Get through clientd, writer and reader on two hosts.

One master and two clientds (a :class:`~cxlkv.deploy.cluster.LocalCluster` on one
pre-faulted ``/dev/shm`` region). The writer process talks to clientd A, the
reader process to clientd B (separate processes, ``multiprocessing`` spawn), so
every byte read was written by the other "host". Measured:

* Put and Get of 4 KiB, 64 KiB, 1 MiB, 16 MiB and 64 MiB values:
  ``path = "shared_buffer"`` (zero-copy ``put_from`` / ``get_into`` on
  :meth:`cxlkv.Client.buffer` memory) and the bytes API (``put`` / ``get``:
  ``path = "inline"`` when the value travels inside the message — up to the
  daemon's inline limit — else ``"staged"``, copied through the SDK's pool),
  and ``path = "direct"``: direct mode (the SDK maps the region and copies
  between plain numpy arrays and the region itself, hashing them; the daemon
  answers metadata only — docs/sdk.md), at every size. 16 MiB and 64 MiB
  zero-copy and direct are also measured with several callers in flight
  (threads of one process; ``concurrency`` says how many);
* 4 KiB single-key Put and Get ops/s with 1 caller and with 16 callers (16
  separate processes), ``concurrency`` 1 / 16;
* 4 KiB batched: 128 keys per call (``batch`` 128): ``put_many`` / ``get_many``
  (inline) and ``put_from_many`` / ``get_into_many`` (zero-copy), one caller, and
  zero-copy with 4 calls in flight (threads of one process; the daemon merges
  their master work); ``ops_per_s`` counts keys, latencies are per call.

Beside each figure, ``limit_gbps`` is memcpy of the same size measured in the
same run (:func:`cxlkv.bench.common.measure_memcpy_gbps`: warm buffers, so up to a
few MiB it runs at cache speed). Gets from 64 KiB also carry ``cold_limit_gbps``
and ``ratio_to_cold_limit``: memcpy from a source out of this core's caches
(:func:`cxlkv.bench.common.measure_cold_memcpy_gbps`), which is where a get's
bytes always are -- another process wrote them -- and ``written_limit_gbps`` /
``ratio_to_written_limit``: memcpy of bytes another process has just written, still
modified in its core's cache (:func:`cxlkv.bench.common.measure_written_memcpy_gbps`;
slower than either at 1 MiB on this VM). The single-key 4 KiB
figures of the bytes API (``path = "inline"``, 1 and 16 callers) are bound by the
cost of a call, not by bytes, so they also carry the per-call ceilings of
:mod:`cxlkv.bench.calls` measured in the same run with as many caller processes:
``echo_limit_ops_per_s`` (a Python echo over a Unix socket),
``call_limit_ops_per_s`` (the daemon's framing and loop answering a no-op), their
median latencies (``echo_limit_p50_us``, ``call_limit_p50_us``) and
``ratio_to_call_limit`` (ops/s over the no-op ceiling). ``--compare
mooncake`` also runs ``../shared/peer/mooncake_kv_bench.py`` (Mooncake Store on
this machine, same record shape) when its virtual environment exists, and
prints both side by side.

``path = "default"`` is :class:`cxlkv.Client` with its defaults, as an application
makes it: direct mode, so gets are read from the region's index with no RPC
(docs/sdk.md), and puts commit reserved extents in one master round trip; the
single-key 4 KiB figures with 1 and 16 callers use it.

Must show: 16 MiB zero-copy Put and Get ``ratio_to_limit`` >= 0.6, direct >= 0.8; 4 KiB with 16
callers >= 8,000 Put/s and >= 15,000 Get/s; 4 KiB batched Get >= 100,000 keys/s. Issue 17:
4 KiB get (default Client, one caller) p50 <= 15 us, 64 KiB <= 25 us, 1 MiB >= 0.5 x memcpy;
4 KiB get with 16 callers >= 200,000/s; 4 KiB put p50 <= 200 us; batched 4 KiB puts >= 100,000 keys/s.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from cxlkv.bench.calls import KINDS as CALL_LIMIT_KINDS
from cxlkv.bench.calls import CallLimit, measure_call_limit
from cxlkv.bench.common import (Record, Timing, emit, measure_cold_memcpy_gbps, measure_memcpy_gbps,
                                measure_written_memcpy_gbps, ops_for,
                                output_options)

__all__ = ["run_kv", "must_show_failures", "kv_cmd", "SIZES"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
#: Value sizes of the Put/Get sweep, bytes.
SIZES = [4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB]
#: Callers in flight for the large zero-copy figures.
LARGE_CONCURRENCY = 3
BATCH = 128
#: Times each key is read by the 16 single-key get callers (reads from the index are fast).
GET_REPEAT = 10
#: Batched calls in flight (threads of one process) for the concurrent batched figures.
BATCH_CONCURRENCY = 4
BENCH = "kv"
#: Region size of the bench cluster, bytes (holds one run of the largest size).
REGION_BYTES = 2 * GiB
POOL_BYTES = 512 * MiB


def _content(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


# =============================================================== role processes
class _Role:
    """A writer or reader process: one Client, buffers, timed loops."""

    def __init__(self, socket_path: str) -> None:
        from cxlkv import Client

        # The daemon paths are measured without direct mode, the direct path with it
        # for every size (threshold 0) and its region mapping pre-faulted.
        self.client = Client(socket_path, buffer_pool_bytes=POOL_BYTES, direct=False)
        self.direct = Client(socket_path, buffer_pool_bytes=POOL_BYTES, direct_threshold_bytes=0,
                             direct_prefault=True)
        if not self.direct.direct:
            raise RuntimeError(f"direct mode unavailable: {self.direct.direct_status}")
        # What an application gets: cxlkv.Client with its defaults (direct mode where the
        # region can be mapped, reads from the region's index: docs/sdk.md).
        self.default = Client(socket_path, buffer_pool_bytes=POOL_BYTES, direct_prefault=True)
        self.buffers: dict[tuple[int, int], memoryview] = {}
        self.arrays: dict[tuple[int, int], np.ndarray] = {}

    def array(self, size: int, slot: int) -> np.ndarray:
        """A plain (not shared) numpy array holding the writer's content, faulted in."""
        a = self.arrays.get((size, slot))
        if a is None:
            a = np.frombuffer(_content(size, size), dtype=np.uint8).copy()
            self.arrays[(size, slot)] = a
        return a

    def buffer(self, size: int, slot: int) -> memoryview:
        b = self.buffers.get((size, slot))
        if b is None:
            b = self.client.buffer(size)
            b[:] = _content(size, size)  # fault the pages in; the writer's content
            self.buffers[(size, slot)] = b
        return b

    def run(self, cmd: dict[str, Any]) -> Any:
        op = cmd["op"]
        if op == "remove":
            return self.client.remove_all(regex=cmd["args"]["regex"], force=True)
        if op == "stat":
            return self.client.stat()
        return getattr(self, "_" + op)(**cmd["args"])

    # ----------------------------------------------------------- single keys
    def _timed(self, keys: list[str], concurrency: int, body: Callable[[int, str], None]) -> tuple[float, list[int]]:
        """Run ``body(slot, key)`` for every key with ``concurrency`` threads; (wall s, latencies ns)."""
        return self._timed_chunks([[k] for k in keys], concurrency, lambda slot, chunk: body(slot, chunk[0]))

    def _put(self, keys: list[str], size: int, path: str, concurrency: int) -> tuple[float, list[int]]:
        c = self.default if path == "default" else self.client
        if path == "shared_buffer":
            bufs = [self.buffer(size, s) for s in range(concurrency)]
            return self._timed(keys, concurrency, lambda s, k: c.put_from(k, bufs[s]))
        if path == "direct":
            d = self.direct
            arrs = [self.array(size, s) for s in range(concurrency)]
            return self._timed(keys, concurrency, lambda s, k: d.put_from(k, arrs[s]))
        value = _content(size, size)
        return self._timed(keys, concurrency, lambda s, k: c.put(k, value))

    def _get(self, keys: list[str], size: int, path: str, concurrency: int) -> tuple[float, list[int]]:
        c = self.default if path == "default" else self.client
        expect = _content(size, size)
        if path in ("shared_buffer", "direct"):
            if path == "direct":
                c = self.direct
                bufs = [memoryview(self.array(size, 100 + s)) for s in range(concurrency)]
            else:
                bufs = [self.buffer(size, 100 + s) for s in range(concurrency)]

            def body(s: int, k: str) -> None:
                if c.get_into(k, bufs[s]) != size:
                    raise RuntimeError(f"get_into {k}: wrong size")

            res = self._timed(keys, concurrency, body)
            if bytes(bufs[0][:64]) != expect[:64] or bytes(bufs[0][-64:]) != expect[-64:]:
                raise RuntimeError(f"read back wrong bytes for size {size}")
            return res
        got: list[bytes] = []

        def body_bytes(s: int, k: str) -> None:
            v = c.get(k)
            if len(v) != size:
                raise RuntimeError(f"get {k}: {len(v)} bytes, expected {size}")
            if not got:
                got.append(v)

        res = self._timed(keys, concurrency, body_bytes)
        if got and got[0] != expect:
            raise RuntimeError(f"read back wrong bytes for size {size}")
        return res

    # ---------------------------------------------------------------- batches
    def _put_batch(self, keys: list[str], size: int, path: str, concurrency: int = 1) -> tuple[float, list[int]]:
        c = self.client
        value = _content(size, size)
        srcs: list[list[memoryview]] = []
        if path == "shared_buffer":
            for slot in range(concurrency):
                buf = self.buffer(size * BATCH, slot)
                views = [buf[i * size:(i + 1) * size] for i in range(BATCH)]
                for v in views:
                    v[:] = value
                srcs.append(views)

        def call(slot: int, chunk: list[str]) -> None:
            if path == "shared_buffer":
                res = c.put_from_many(chunk, srcs[slot][:len(chunk)])
            else:
                res = c.put_many([(k, value) for k in chunk])
            bad = [r.error for r in res if not r.ok]
            if bad:
                raise RuntimeError(f"batched put failed: {bad[0]!r}")

        return self._batched(keys, concurrency, call)

    def _get_batch(self, keys: list[str], size: int, path: str, concurrency: int = 1) -> tuple[float, list[int]]:
        c = self.client
        dsts: list[list[memoryview]] = []
        if path == "shared_buffer":
            for slot in range(concurrency):
                buf = self.buffer(size * BATCH, 100 + slot)
                dsts.append([buf[i * size:(i + 1) * size] for i in range(BATCH)])

        def call(slot: int, chunk: list[str]) -> None:
            if path == "shared_buffer":
                res = c.get_into_many(chunk, dsts[slot][:len(chunk)])
            else:
                res = c.get_many(chunk)
            bad = [r.error for r in res if not r.ok]
            if bad:
                raise RuntimeError(f"batched get failed: {bad[0]!r}")

        return self._batched(keys, concurrency, call)

    def _batched(self, keys: list[str], concurrency: int,
                 call: Callable[[int, list[str]], None]) -> tuple[float, list[int]]:
        """``call(slot, chunk)`` for every chunk of :data:`BATCH` keys, ``concurrency``
        threads each taking every ``concurrency``-th chunk; (wall s, per-call latencies ns)."""
        chunks = [keys[j:j + BATCH] for j in range(0, len(keys), BATCH)]
        return self._timed_chunks(chunks, concurrency, call)

    def _timed_chunks(self, chunks: list[list[str]], concurrency: int,
                      call: Callable[[int, list[str]], None]) -> tuple[float, list[int]]:
        """``call(slot, chunk)`` for every chunk, ``concurrency`` threads each taking every
        ``concurrency``-th chunk (thread ``slot`` uses buffer slot ``slot``); (wall s from
        the common start to the last end, per-call latencies ns)."""
        per = [chunks[i::concurrency] for i in range(concurrency)]
        lats: list[list[int]] = [[] for _ in range(concurrency)]
        errors: list[BaseException] = []
        start = threading.Barrier(concurrency + 1)

        def worker(slot: int) -> None:
            clock = time.perf_counter_ns
            start.wait()
            try:
                for chunk in per[slot]:
                    t = clock()
                    call(slot, chunk)
                    lats[slot].append(clock() - t)
            except BaseException as exc:  # reported to the driver
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(s,)) for s in range(concurrency)]
        for t in threads:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return wall, [x for lat in lats for x in lat]


def _role_main(conn: Any, socket_path: str) -> None:
    try:
        role = _Role(socket_path)
    except BaseException as exc:
        conn.send(("err", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ok", os.getpid()))
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        try:
            conn.send(("ok", role.run(cmd)))
        except BaseException as exc:  # to the driver, with the command
            conn.send(("err", f"{cmd['op']}: {type(exc).__name__}: {exc}"))
    role.client.close()
    role.direct.close()


def _caller_main(socket_path: str, op: str, keys: list[str], value_size: int, barrier: Any, queue: Any) -> None:
    """One of many single-key caller processes: wait at the barrier, run, report."""
    from cxlkv import Client

    try:
        with Client(socket_path) as c:
            value = _content(value_size, value_size)
            if op == "get":
                c.get(keys[0])  # connect and warm up
            barrier.wait()
            lat = np.empty(len(keys), dtype=np.int64)
            clock = time.perf_counter_ns
            t0 = clock()
            prev = t0
            if op == "put":
                for i, k in enumerate(keys):
                    c.put(k, value)
                    now = clock()
                    lat[i] = now - prev
                    prev = now
            else:
                for i, k in enumerate(keys):
                    c.get(k)
                    now = clock()
                    lat[i] = now - prev
                    prev = now
            queue.put(("ok", t0, prev, lat))
    except BaseException as exc:
        queue.put(("err", f"{type(exc).__name__}: {exc}", 0, None))


class _Remote:
    """The driver's handle on one role process."""

    def __init__(self, ctx: Any, socket_path: str) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_role_main, args=(child, socket_path), daemon=True)
        self.proc.start()
        self._reply()

    def _reply(self) -> Any:
        if not self.conn.poll(600):
            raise RuntimeError("benchmark role process did not answer within 600 s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(value)
        return value

    def __call__(self, op: str, **args: Any) -> Any:
        self.conn.send({"op": op, "args": args})
        return self._reply()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


# ====================================================================== driver
def _many_callers(ctx: Any, socket_path: str, op: str, keys: list[str], n: int, size: int) -> tuple[float, np.ndarray]:
    """``n`` processes each doing its share of ``keys``; (wall s from first start to last end, latencies)."""
    barrier = ctx.Barrier(n)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_caller_main, args=(socket_path, op, keys[i::n], size, barrier, queue), daemon=True)
             for i in range(n)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    errs = [r[1] for r in results if r[0] != "ok"]
    if errs:
        raise RuntimeError(f"caller failed: {errs[0]}")
    start = min(r[1] for r in results)
    end = max(r[2] for r in results)
    return (end - start) / 1e9, np.concatenate([r[3] for r in results])


def _call_limits(ctx: Any, callers: int, calls_per_caller: int, log: Callable[[str], None],
                 before: dict[str, CallLimit] | None = None) -> dict[str, CallLimit]:
    """The per-call ceilings (:mod:`cxlkv.bench.calls`) with ``callers`` caller
    processes, by kind; given ``before`` (the same measured earlier in the run),
    the faster of the two per kind, as :func:`_settle_limits` does for memcpy."""
    out: dict[str, CallLimit] = {}
    for kind in CALL_LIMIT_KINDS:
        lim = measure_call_limit(ctx, kind, callers, calls_per_caller)
        log(f"  call limit {kind:<4} {callers:>2} caller(s): {lim.ops_per_s:,.0f} calls/s, p50 {lim.p50_us:.0f} us")
        earlier = (before or {}).get(kind)
        out[kind] = earlier if earlier is not None and earlier.ops_per_s > lim.ops_per_s else lim
    return out


#: Gets from this size on also carry ``cold_limit_gbps`` (see :func:`_settle_limits`).
COLD_LIMIT_MIN_BYTES = 64 * 1024


def _settle_limits(records: list[Record], first: dict[int, float], log: Callable[[str], None]) -> None:
    """Measure each size's memcpy limit again after the run and rate every record
    against the larger of the two measurements.

    On a shared VM one limit measurement can land in a slow moment (16 MiB ran
    13.7 GB/s in one run, 19.9 in another); taking the best of the run's start and
    end keeps such a moment from inflating the ratios (it can only lower them).
    """
    for size, before in sorted(first.items()):
        after = measure_memcpy_gbps(size, runs=3)
        first[size] = max(before, after)
        if after > before * 1.1:
            log(f"memcpy limit at {size} B: {before:.2f} GB/s at the start, {after:.2f} at the end; "
                "rating against the larger")
    for rec in records:
        lim = first.get(rec.size_bytes)
        if lim:
            rec.limit_gbps = lim
            rec.ratio_to_limit = rec.gbps / lim
    # A get reads what another clientd's process wrote: its source is never in the
    # reader's caches (on a CXL pool, never in any of this host's), so beside the
    # warm limit each get also gets a copy from a source out of cache.
    # And a copy of bytes another process has just written, still modified in its
    # core's cache (a value put on this host a moment ago): slower than either.
    cold: dict[int, float] = {}
    written: dict[int, float] = {}
    for rec in records:
        if rec.op != "get" or rec.size_bytes < COLD_LIMIT_MIN_BYTES:
            continue
        if rec.size_bytes not in cold:
            cold[rec.size_bytes] = max(measure_cold_memcpy_gbps(rec.size_bytes) for _ in range(2))
            written[rec.size_bytes] = max(measure_written_memcpy_gbps(rec.size_bytes) for _ in range(2))
        rec.extra["cold_limit_gbps"] = round(cold[rec.size_bytes], 3)
        rec.extra["ratio_to_cold_limit"] = round(rec.gbps / cold[rec.size_bytes], 3)
        rec.extra["written_limit_gbps"] = round(written[rec.size_bytes], 3)
        rec.extra["ratio_to_written_limit"] = round(rec.gbps / written[rec.size_bytes], 3)


def run_kv(*, quick: bool = False, log: Callable[[str], None] = lambda m: None,
           run_dir: str | None = None, coherence: str = "coherent") -> list[Record]:
    """Run the benchmark on a fresh local cluster; returns the records.

    Args:
        quick: fewer and smaller runs.
        log: progress lines.
        run_dir: the cluster's directory (default: a temporary one).
        coherence: the clientds' ``coherence`` mode (``"coherent"`` or ``"flush"``);
            every record carries it in a ``coherence`` field.

    Raises:
        RuntimeError: a role process failed (its message says which operation).
        cxlkv.deploy.cluster.ClusterError: the cluster did not start.
    """
    from cxlkv.deploy.cluster import LocalCluster

    runs = 2 if quick else 3
    bytes_per_run = (64 if quick else 256) * MiB
    ctx = mp.get_context("spawn")
    records: list[Record] = []
    limits: dict[int, float] = {}

    def limit(size: int) -> float:
        if size not in limits:
            limits[size] = measure_memcpy_gbps(size, runs=3)
        return limits[size]

    tmp = tempfile.TemporaryDirectory(prefix="cxlkv-bench-kv-") if run_dir is None else None
    directory = run_dir or tmp.name  # type: ignore[union-attr]
    log(f"starting a cluster (1 master, 2 clientds, {REGION_BYTES >> 20} MiB region, prefaulted, "
        f"coherence {coherence})")
    cluster = LocalCluster(directory, clientds=2, region_size_bytes=REGION_BYTES,
                           clientd_options={"prefault": True, "coherence": coherence}, start_timeout_s=120)
    cluster.start()
    writer = reader = None
    try:
        writer = _Remote(ctx, cluster.socket_path(0))
        reader = _Remote(ctx, cluster.socket_path(1))

        def record(op: str, size: int, timing: Timing, **extra: Any) -> None:
            extra["coherence"] = coherence
            rec = Record.from_timing(BENCH, op, size, timing, limit(size), **extra)
            records.append(rec)
            log(f"  {op:<5} {size >> 10:>6} KiB {extra}: {rec.ops_per_s:,.0f} ops/s, {rec.gbps:.2f} GB/s, "
                f"p50 {rec.p50_us:.0f} us, ratio {rec.ratio_to_limit:.2f}"
                + (f", {extra['ratio_to_call_limit']:.2f} of a no-op call" if "ratio_to_call_limit" in extra else ""))

        # ---- Put / Get sweep -------------------------------------------------
        for mode, size, path, conc, put_t, get_t in _sweep({coherence: (writer, reader)}, _sweep_plan(),
                                                           runs, bytes_per_run, quick):
            record("put", size, put_t, path=path, concurrency=conc, batch=1)
            record("get", size, get_t, path=path, concurrency=conc, batch=1)

        # ---- 4 KiB single key, 1 and 16 callers ---------------------------
        size = 4 * KiB
        for callers in (1, 16):
            per_caller = (150 if quick else 500) if callers > 1 else (1000 if quick else 3000)
            ceilings = _call_limits(ctx, callers, per_caller, log)
            puts, gets = [], []
            for r in range(runs + 1):
                keys = [f"bench/small/{callers}/{r}/{i}" for i in range(per_caller * callers)]
                if callers == 1:
                    wall, lat = writer("put", keys=keys, size=size, path="default", concurrency=1)
                    pw = (wall, np.asarray(lat))
                    gwall, glat = reader("get", keys=keys, size=size, path="default", concurrency=1)
                    gw = (gwall, np.asarray(glat))
                else:
                    pw = _many_callers(ctx, cluster.socket_path(0), "put", keys, callers, size)
                    # A get from the index takes microseconds: each key is read GET_REPEAT times,
                    # so a run lasts long enough that 16 processes starting on 2 cores do not
                    # dominate it (500 gets per caller: 69k gets/s; 5,000: 149k, measured here).
                    gw = _many_callers(ctx, cluster.socket_path(1), "get", keys * GET_REPEAT, callers, size)
                if r:
                    puts.append(pw)
                    gets.append(gw)
                writer("remove", regex=f"^bench/small/{callers}/{r}/")
            ceilings = _call_limits(ctx, callers, per_caller, log, ceilings)
            for op, runs_ in (("put", puts), ("get", gets)):
                t = Timing.from_runs(runs_)
                echo, noop = ceilings["echo"], ceilings["noop"]
                record(op, size, t, path="default", concurrency=callers, batch=1,
                       echo_limit_ops_per_s=echo.ops_per_s, echo_limit_p50_us=echo.p50_us,
                       call_limit_ops_per_s=noop.ops_per_s, call_limit_p50_us=noop.p50_us,
                       ratio_to_call_limit=t.ops_per_s / noop.ops_per_s)

        # ---- 4 KiB batched, 128 keys per call (1 caller, and 4 in flight) --------
        n_keys = BATCH * (24 if quick else 64)
        for path, conc in (("inline", 1), ("shared_buffer", 1), ("shared_buffer", BATCH_CONCURRENCY)):
            puts, gets = [], []
            for r in range(runs + 1):
                keys = [f"bench/batch/{path}/{r}/{i}" for i in range(n_keys)]
                wall, lat = writer("put_batch", keys=keys, size=size, path=path, concurrency=conc)
                gwall, glat = reader("get_batch", keys=keys, size=size, path=path, concurrency=conc)
                if r:
                    # one latency per call; throughput counts keys
                    puts.append((wall, np.repeat(np.asarray(lat) / BATCH, BATCH)))
                    gets.append((gwall, np.repeat(np.asarray(glat) / BATCH, BATCH)))
                writer("remove", regex=f"^bench/batch/{path}/{r}/")
            pt, gt = Timing.from_runs(puts), Timing.from_runs(gets)
            # latencies are per call (128 keys), not per key
            record("put", size, _per_call(pt), path=path, concurrency=conc, batch=BATCH)
            record("get", size, _per_call(gt), path=path, concurrency=conc, batch=BATCH)
        st = reader("stat")
        log(f"reader's clientd counters: { {k: v for k, v in st.get('counters', {}).items() if 'master_calls' in k} }")
        _settle_limits(records, limits, log)
    finally:
        for role in (writer, reader):
            if role is not None:
                role.close()
        killed = cluster.stop()
        if tmp is not None:
            tmp.cleanup()
        if killed:
            log(f"warning: processes had to be killed at the end: {killed}")
    return records


def _sweep_plan(min_size: int = 0) -> list[tuple[int, str, int]]:
    """The Put/Get sweep's ``(size, path, callers)`` configurations, sizes >= ``min_size``."""
    plan: list[tuple[int, str, int]] = []
    for size in SIZES:
        if size < min_size:
            continue
        plan.append((size, "shared_buffer", 1))
        if size >= 16 * MiB:
            plan.append((size, "shared_buffer", LARGE_CONCURRENCY))
        plan.append((size, "inline" if size <= MiB else "staged", 1))
        if size <= MiB:
            plan.append((size, "default", 1))  # cxlkv.Client() as an application makes it
        plan.append((size, "direct", 1))
        if size >= 16 * MiB:
            plan.append((size, "direct", LARGE_CONCURRENCY))
    return plan


def _sweep(roles: dict[str, tuple[Any, Any]], plan: list[tuple[int, str, int]], runs: int, bytes_per_run: int,
           quick: bool, log: Callable[[str], None] = lambda m: None) -> list[tuple[str, int, str, int, Timing, Timing]]:
    """Run the Put/Get sweep for every ``(writer, reader)`` pair of ``roles`` (one per
    coherence mode), the modes taking turns run by run within each configuration,
    so a change in machine load hits every mode alike.

    Returns:
        ``(mode, size, path, callers, put timing, get timing)`` per mode and configuration.
    """
    out = []
    for size, path, conc in plan:
        # Large values: longer runs (start and tail of a run weigh less), and
        # as many operations per caller.
        per_run = bytes_per_run if size < 16 * MiB else 3 * bytes_per_run
        n = ops_for(size, bytes_per_run=per_run, min_ops=max(4, conc * 2), max_ops=500 if quick else 2000)
        n = -(-n // conc) * conc
        puts: dict[str, list[tuple[float, np.ndarray]]] = {m: [] for m in roles}
        gets: dict[str, list[tuple[float, np.ndarray]]] = {m: [] for m in roles}
        for r in range(runs + 1):  # run 0 warms up
            order = list(roles.items())
            if r % 2:
                order.reverse()  # no mode always goes first
            for mode, (writer, reader) in order:
                keys = [f"bench/{size}/{path}/{conc}/{r}/{i}" for i in range(n)]
                wall, lat = writer("put", keys=keys, size=size, path=path, concurrency=conc)
                gwall, glat = reader("get", keys=keys, size=size, path=path, concurrency=conc)
                if r:
                    puts[mode].append((wall, np.asarray(lat)))
                    gets[mode].append((gwall, np.asarray(glat)))
                writer("remove", regex=f"^bench/{size}/{path}/{conc}/{r}/")
        for mode in roles:
            out.append((mode, size, path, conc, Timing.from_runs(puts[mode]), Timing.from_runs(gets[mode])))
        if len(roles) > 1:
            log(f"  {size >> 10:>6} KiB {path} x{conc}: " + ", ".join(
                f"{m} put {size * out[-len(roles) + i][4].ops_per_s / 1e9:.2f} get "
                f"{size * out[-len(roles) + i][5].ops_per_s / 1e9:.2f} GB/s" for i, m in enumerate(roles)))
    return out


def run_kv_coherence(*, quick: bool = False, log: Callable[[str], None] = lambda m: None,
                     min_size: int = MiB) -> list[Record]:
    """The Put/Get sweep in both coherence modes at once: two local clusters (one
    with ``coherence = "coherent"`` clientds, one with ``"flush"``), their runs
    interleaved configuration by configuration and run by run (:func:`_sweep`),
    so the flush/coherent ratio compares moments of equal machine load.

    Args:
        quick: fewer and smaller runs.
        log: progress lines.
        min_size: leave out sizes below this many bytes (default 1 MiB, the
            range of issue 26's bar; 0: every size of the sweep, 4 KiB up).

    Returns:
        One record per op, mode and configuration; each has a ``coherence``
        field and, in flush mode, ``ratio_to_coherent``: the median over runs of
        each flush run's throughput over the coherent run next to it in time
        (5 runs, the modes' order alternating; paired, so a load change that
        hits one run hits its pair too).

    Raises:
        RuntimeError: a role process failed.
        cxlkv.deploy.cluster.ClusterError: a cluster did not start.
    """
    from cxlkv.deploy.cluster import LocalCluster

    runs = 2 if quick else 5
    bytes_per_run = (64 if quick else 256) * MiB
    ctx = mp.get_context("spawn")
    limits: dict[int, float] = {}
    records: list[Record] = []
    timings: dict[tuple[str, str, int, str, int], Timing] = {}
    tmp = tempfile.TemporaryDirectory(prefix="cxlkv-bench-kv-coh-")
    clusters: dict[str, Any] = {}
    roles: dict[str, tuple[Any, Any]] = {}
    try:
        for mode in ("coherent", "flush"):
            log(f"starting a {mode} cluster (1 master, 2 clientds, {REGION_BYTES >> 20} MiB region, prefaulted)")
            cl = LocalCluster(os.path.join(tmp.name, mode), clientds=2, region_size_bytes=REGION_BYTES,
                              clientd_options={"prefault": True, "coherence": mode}, start_timeout_s=120)
            cl.start()
            clusters[mode] = cl
            roles[mode] = (_Remote(ctx, cl.socket_path(0)), _Remote(ctx, cl.socket_path(1)))
        plan = _sweep_plan(min_size)
        for size in {s for s, _, _ in plan}:
            limits[size] = measure_memcpy_gbps(size, runs=3)
        for mode, size, path, conc, put_t, get_t in _sweep(roles, plan, runs, bytes_per_run, quick, log):
            for op, t in (("put", put_t), ("get", get_t)):
                timings[(mode, op, size, path, conc)] = t
                rec = Record.from_timing(BENCH, op, size, t, limits[size], path=path, concurrency=conc, batch=1,
                                         coherence=mode)
                records.append(rec)
                log(f"  {mode:<8} {op:<3} {size >> 10:>6} KiB {path} x{conc}: {rec.gbps:.2f} GB/s")
        _settle_limits(records, limits, log)
        for r in records:
            cfg = (r.op, r.size_bytes, r.extra["path"], r.extra["concurrency"])
            if r.extra["coherence"] == "flush" and ("coherent", *cfg) in timings:
                # paired: each flush run over the coherent run next to it in time, median over runs
                f, c = timings[("flush", *cfg)], timings[("coherent", *cfg)]
                pairs = [a / b for a, b in zip(f.run_ops_per_s, c.run_ops_per_s) if b]
                r.extra["ratio_to_coherent"] = round(statistics.median(pairs), 3) if pairs else None
    finally:
        for pair in roles.values():
            for role in pair:
                role.close()
        for cl in clusters.values():
            killed = cl.stop()
            if killed:
                log(f"warning: processes had to be killed at the end: {killed}")
        tmp.cleanup()
    return records


def coherence_failures(records: list[Record], min_size: int = MiB, bar: float = 0.85) -> list[str]:
    """Configurations of ``min_size`` bytes and more where flush-mode throughput is
    under ``bar`` x coherent-mode throughput (issue 26's bar: 0.85 from 1 MiB)."""
    out = []
    for r in records:
        ratio = r.extra.get("ratio_to_coherent")
        if r.extra.get("coherence") == "flush" and r.size_bytes >= min_size and ratio is not None and ratio < bar:
            out.append(f"flush/coherent {r.op} {r.size_bytes >> 10} KiB {r.extra.get('path')} "
                       f"x{r.extra.get('concurrency')}: {ratio:.2f} < {bar}")
    return out


def coherence_cost(records: list[Record]) -> list[str]:
    """One line per Put/Get configuration measured in both modes: flush-mode
    throughput as a fraction of coherent-mode throughput (the issue's bar: the
    flush mode costs at most 15% for values of 1 MiB and more)."""
    by: dict[tuple[Any, ...], dict[str, Record]] = {}
    for r in records:
        e = r.extra
        cfg = (r.op, r.size_bytes, e.get("path"), e.get("concurrency"), e.get("batch"))
        by.setdefault(cfg, {})[str(e.get("coherence"))] = r
    lines = []
    for (op, size, path, conc, batch), modes in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if "coherent" in modes and "flush" in modes and modes["coherent"].gbps:
            ratio = modes["flush"].gbps / modes["coherent"].gbps
            paired = modes["flush"].extra.get("ratio_to_coherent")
            lines.append(f"flush/coherent {op:<4} {size >> 10:>7} KiB {path} x{conc} batch {batch}: "
                         f"{modes['flush'].gbps:.2f} / {modes['coherent'].gbps:.2f} GB/s = {ratio:.2f}"
                         + (f" (paired runs: {paired:.2f})" if paired is not None else ""))
    return lines


def _per_call(t: Timing) -> Timing:
    """Latencies of a batched timing were spread per key; report them per call again."""
    return Timing(t.ops_per_s, t.p50_us * BATCH, t.p99_us * BATCH, t.run_ops_per_s, t.ops_per_run)


def must_show_failures(records: list[Record]) -> list[str]:
    """The issue's targets that these records miss (empty when all are met)."""
    out: list[str] = []

    def best(op: str, size: int, **match: Any) -> Record | None:
        cands = [r for r in records if r.op == op and r.size_bytes == size
                 and all(r.extra.get(k) == v for k, v in match.items())]
        return max(cands, key=lambda r: r.ops_per_s) if cands else None

    for op in ("put", "get"):
        r = best(op, 16 * MiB, path="shared_buffer")
        if r is None or (r.ratio_to_limit or 0) < 0.6:
            out.append(f"16 MiB zero-copy {op}: ratio_to_limit {r.ratio_to_limit if r else None} < 0.6")
        r = best(op, 16 * MiB, path="direct")
        if r is None or (r.ratio_to_limit or 0) < 0.8:
            out.append(f"16 MiB direct {op}: ratio_to_limit {r.ratio_to_limit if r else None} < 0.8")
    for op, target in (("put", 8_000), ("get", 15_000)):
        r = best(op, 4 * KiB, concurrency=16, batch=1)
        if r is None or r.ops_per_s < target:
            noop = r.extra.get("call_limit_ops_per_s") if r else None
            out.append(f"4 KiB {op} with 16 callers: {r.ops_per_s if r else 0:,.0f}/s < {target:,}/s"
                       + (f" (a no-op call through the same stack: {noop:,.0f}/s)" if noop else ""))
    r = best("get", 4 * KiB, batch=BATCH)
    if r is None or r.ops_per_s < 100_000:
        out.append(f"4 KiB batched get: {r.ops_per_s if r else 0:,.0f} keys/s < 100,000/s")
    # issue 17: reads from the region's index, writes in one round trip
    for size, p50 in ((4 * KiB, 15.0), (64 * KiB, 25.0)):
        r = best("get", size, path="default", concurrency=1, batch=1)
        if r is None or r.p50_us > p50:
            out.append(f"{size >> 10} KiB get, one caller, default Client: p50 {r.p50_us if r else None} us > {p50} us")
    r = best("get", MiB, path="default", concurrency=1, batch=1)
    if r is None or (r.ratio_to_limit or 0) < 0.5:
        out.append(f"1 MiB get, default Client: ratio_to_limit {r.ratio_to_limit if r else None} < 0.5"
                   + (f" (ratio_to_cold_limit {r.extra['ratio_to_cold_limit']}, ratio_to_written_limit "
                      f"{r.extra.get('ratio_to_written_limit')})" if r and "ratio_to_cold_limit" in r.extra else ""))
    r = best("get", 4 * KiB, concurrency=16, batch=1)
    if r is None or r.ops_per_s < 200_000:
        out.append(f"4 KiB get with 16 callers: {r.ops_per_s if r else 0:,.0f}/s < 200,000/s")
    r = best("put", 4 * KiB, path="default", concurrency=1, batch=1)
    if r is None or r.p50_us > 200:
        out.append(f"4 KiB put, one caller: p50 {r.p50_us if r else None} us > 200 us")
    r = best("put", 4 * KiB, batch=BATCH)
    if r is None or r.ops_per_s < 100_000:
        out.append(f"4 KiB batched put: {r.ops_per_s if r else 0:,.0f} keys/s < 100,000/s")
    return out


# ================================================================ mooncake peer
def _peer_paths() -> tuple[Path, Path]:
    root = Path(__file__).resolve().parents[1]
    return root.parent / "shared" / "peer" / "mooncake_kv_bench.py", Path("/tmp/mooncake-venv")


def run_mooncake(log: Callable[[str], None]) -> list[dict[str, Any]] | None:
    """Run the peer benchmark if its script and virtual environment exist; its records or ``None``."""
    script, venv = _peer_paths()
    python = venv / "bin" / "python"
    if not script.exists() or not python.exists():
        log(f"--compare mooncake: skipped ({script if not script.exists() else python} not found; "
            "see ../shared/peer/README.md)")
        return None
    log("running the Mooncake peer benchmark")
    args = [str(python), str(script)]
    master = venv / "bin" / "mooncake_master"
    if master.exists():
        args += ["--master-bin", str(master)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    try:
        recs = json.loads(p.stdout[p.stdout.index("["):])
    except ValueError:
        log(f"--compare mooncake: no records (exit {p.returncode}): {p.stderr.strip()[-500:]}")
        return None
    return recs if isinstance(recs, list) else None


def print_comparison(records: list[Record], peer: list[dict[str, Any]]) -> None:
    """Side-by-side table: cxlkv's best single-caller figure vs Mooncake's, per op and size."""
    from tabulate import tabulate

    names = {"put": "put", "get": "get", "put_single_bytes": "put", "get_single_bytes": "get"}
    rows = []
    for p in peer:
        op = names.get(p.get("op", ""), p.get("op", ""))
        zero_copy = p.get("zero_copy", False)
        size = int(p.get("size_bytes", 0))
        mine = [r for r in records if r.op == op and r.size_bytes == size and r.extra.get("concurrency") == 1
                and r.extra.get("batch") == 1
                and (r.extra.get("path") == "shared_buffer") == bool(zero_copy)]
        m = max(mine, key=lambda r: r.ops_per_s) if mine else None
        rows.append([f"{op}{' zc' if zero_copy else ''}", size, f"{p.get('ops_per_s', 0):,.0f}",
                     f"{p.get('gbps', 0):.2f}", f"{m.ops_per_s:,.0f}" if m else "-", f"{m.gbps:.2f}" if m else "-",
                     f"{m.ops_per_s / p['ops_per_s']:.1f}x" if m and p.get("ops_per_s") else "-"])
    print(tabulate(rows, headers=["op", "size", "mooncake ops/s", "mooncake GB/s", "cxlkv ops/s", "cxlkv GB/s",
                                  "cxlkv/mooncake"]))


def _peer_record(p: dict[str, Any]) -> Record:
    base = {"bench", "op", "size_bytes", "ops_per_s", "gbps", "p50_us", "p99_us", "limit_gbps", "ratio_to_limit"}
    return Record(
        bench=str(p.get("bench", "mooncake")), op=str(p.get("op", "")), size_bytes=int(p.get("size_bytes", 0)),
        ops_per_s=float(p.get("ops_per_s") or 0), gbps=float(p.get("gbps") or 0),
        p50_us=p.get("p50_us"), p99_us=p.get("p99_us"),  # type: ignore[arg-type]
        limit_gbps=p.get("limit_gbps"), ratio_to_limit=p.get("ratio_to_limit"),
        extra={k: v for k, v in p.items() if k not in base},
    )


# ======================================================================== CLI
@click.command("kv")
@output_options
@click.option("--compare", type=click.Choice(["mooncake"]), default=None,
              help="Also run the peer benchmark (../shared/peer) and print both side by side.")
@click.option("--check", is_flag=True, help="Exit 1 when a must-show target is missed.")
@click.option("--coherence", type=click.Choice(["coherent", "flush", "both"]), default="coherent",
              show_default=True,
              help="The clientds' coherence mode; 'both': the Put/Get sweep from 1 MiB in both modes at "
                   "once (two clusters, runs interleaved; records carry 'coherence' and, in flush mode, "
                   "'ratio_to_coherent') and prints flush/coherent throughput.")
def kv_cmd(as_json: bool, out: str | None, quick: bool, compare: str | None, check: bool,
           coherence: str) -> None:
    """End-to-end Put/Get through two clientds (writer on A, reader on B), beside memcpy."""
    from cxlkv.errors import CxlkvError

    records: list[Record] = []
    try:
        if coherence == "both":
            records = run_kv_coherence(quick=quick, log=lambda m: click.echo(m, err=True))
        else:
            records = run_kv(quick=quick, log=lambda m: click.echo(m, err=True), coherence=coherence)
    except (CxlkvError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    if coherence == "both":
        for line in coherence_cost(records):
            click.echo(line, err=True)
        failures = coherence_failures(records)
    else:
        failures = must_show_failures(records)
    peer = run_mooncake(lambda m: click.echo(m, err=True)) if compare == "mooncake" else None
    # With --json the peer's records (same shape, bench "mooncake-…") join the list.
    emit(records + [_peer_record(p) for p in peer or []] if as_json else records, as_json=as_json, out=out)
    if peer and not as_json:
        print()
        print_comparison(records, peer)
    for f in failures:
        click.echo(f"MISSED: {f}", err=True)
    if check and failures:
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    kv_cmd()
