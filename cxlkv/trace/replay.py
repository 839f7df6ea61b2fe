"""``cxlkv replay``: the store's main job on a real workload trace.

For each request of the trace, a worker (standing for an inference engine on
one host) asks its local clientd for the longest cached prefix of the request's
blocks and copies those blocks out in one call (``get_prefix_into``), verifies
every byte, then writes the missing blocks (``put_from_many``, zero-copy from
the SDK's shared buffer). Block contents are a deterministic function of the
block id, so a wrong byte anywhere is caught and counted as an error.

Block size: the trace's blocks are 512 tokens. A real KV block of 512 tokens is
large (Llama-3-8B in bf16: 512 tokens × 32 layers × 2 (K,V) × 8 KV heads × 128 ×
2 bytes = 64 MiB); replay scales each block down to ``--block-bytes`` (default
64 KiB) so the whole trace fits one machine. Hit rates do not depend on the block
size (all blocks are equal); bandwidth figures scale with it.

Cache capacity is a fraction of the replayed requests' unique blocks; the
embedded cluster's region is sized to hold exactly that many blocks, and the
master evicts on allocation failure down to ``low_watermark`` (the high watermark
is 1.0 so only a full cache evicts). The report puts the store's hit rate beside
an in-process simulation of the same policy, capacity and watermarks
(``policy_sim_hit_rate``), an LRU simulation (``lru_sim_hit_rate``), every other
registered policy simulated at the same capacity (``other_sim_hit_rates``: ARC, the
prefix-aware ``prefix``, ...), the offline optimum (``belady_hit_rate``, Belady's MIN
at the same capacity: every report shows the gap) and the unbounded-cache bound
(``bound_hit_rate``).

Tiers (docs/tiers.md): with ``ssd_fraction`` the embedded cluster gets an SSD
tier (a file on disk holding that fraction of the unique blocks) below the CXL
region, and with ``dram_fraction`` each clientd a DRAM tier; the report splits
the hits by the tier that served them (``dram_hit_rate``, ``cxl_hit_rate``,
``ssd_hit_rate``; they sum to ``block_hit_rate``).
"""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import click
import numpy as np

from cxlkv.cli.sizes import Size
from cxlkv.trace.sim import TraceError, load_trace, simulate, simulate_belady, simulate_unbounded, unique_blocks

__all__ = ["ReplayOptions", "ReplayReport", "block_content", "fill_blocks", "verify_blocks", "run_replay", "replay_cmd"]

KiB = 1024
MiB = 1 << 20
DEFAULT_TRACE = "../shared/traces/conversation_trace.jsonl"
#: Where the default trace is looked for, in this order: beside the checkout this
#: package runs from (``<checkout>/../shared/traces/``, as the README says), then
#: relative to the current directory.
DEFAULT_TRACE_HELP = "../shared/traces/conversation_trace.jsonl beside the checkout"


def default_trace_candidates() -> list[Path]:
    """The places the default trace is looked for (absolute, without duplicates)."""
    checkout = Path(__file__).resolve().parents[2]  # <checkout>/cxlkv/trace/replay.py
    out: list[Path] = []
    for p in (checkout / DEFAULT_TRACE, Path.cwd() / DEFAULT_TRACE):
        p = Path(os.path.normpath(p))
        if p not in out:
            out.append(p)
    return out


def resolve_trace(trace: str | None) -> str:
    """The trace file to read: ``trace`` as given (relative to the current
    directory), or with ``None`` the default trace beside the checkout.

    Raises:
        FileNotFoundError: the file is not there; the message names every place looked.
    """
    if trace is not None:
        p = Path(trace)
        if p.is_file():
            return str(p)
        raise FileNotFoundError(f"trace {trace} not found (looked at {p.resolve()})")
    candidates = default_trace_candidates()
    for p in candidates:
        if p.is_file():
            return str(p)
    raise FileNotFoundError(
        "trace not found: no TRACE given and the default conversation trace is not at "
        + " nor at ".join(str(p) for p in candidates) + "; give its path")
_CXL, _DRAM, _SSD = 1, 2, 3  # cxlkv.v1.Tier values


def block_content(block_id: int, block_bytes: int) -> bytes:
    """The bytes of block ``block_id``: 16-byte units ``id, ~id`` (little-endian u64).

    Any byte read from the wrong block, a torn write or a stale line differs.
    """
    unit = (block_id & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little") + (
        ~block_id & 0xFFFFFFFFFFFFFFFF
    ).to_bytes(8, "little")
    reps, rest = divmod(block_bytes, 16)
    return unit * reps + unit[:rest]


def fill_blocks(buf: Any, block_ids: Sequence[int], block_bytes: int) -> None:
    """Write :func:`block_content` of each id into consecutive ``block_bytes``
    slices of ``buf`` (a writable bytes-like object of at least
    ``len(block_ids) * block_bytes`` bytes), in one vectorised pass when
    ``block_bytes`` is a multiple of 16."""
    n = len(block_ids)
    if not n:
        return
    if block_bytes % 16:
        view = memoryview(buf).cast("B")
        for i, b in enumerate(block_ids):
            view[i * block_bytes:(i + 1) * block_bytes] = block_content(b, block_bytes)
        return
    units = _units(buf, n, block_bytes)
    ids = np.fromiter((b & _U64 for b in block_ids), dtype=np.uint64, count=n)[:, None]
    units[:, :, 0] = ids
    units[:, :, 1] = ~ids


def verify_blocks(buf: Any, block_ids: Sequence[int], block_bytes: int) -> list[bool]:
    """Whether each ``block_bytes`` slice of ``buf`` holds :func:`block_content`
    of its id; one bool per id."""
    n = len(block_ids)
    if not n:
        return []
    if block_bytes % 16:
        view = memoryview(buf).cast("B")
        return [view[i * block_bytes:(i + 1) * block_bytes].tobytes() == block_content(b, block_bytes)
                for i, b in enumerate(block_ids)]
    units = _units(buf, n, block_bytes)
    ids = np.fromiter((b & _U64 for b in block_ids), dtype=np.uint64, count=n)[:, None]
    ok = (units[:, :, 0] == ids).all(axis=1) & (units[:, :, 1] == ~ids).all(axis=1)
    return ok.tolist()


_U64 = 0xFFFFFFFFFFFFFFFF


def _units(buf: Any, n: int, block_bytes: int) -> "np.ndarray":
    """``buf``'s first ``n`` blocks as (block, unit, 2) little-endian u64s."""
    return np.frombuffer(buf, dtype="<u8", count=n * block_bytes // 8).reshape(n, block_bytes // 16, 2)


@dataclass(frozen=True)
class ReplayOptions:
    """What to replay and how.

    Attributes:
        trace_path: the JSON-lines trace.
        block_bytes: bytes per 512-token block.
        capacity_fraction: cache capacity as a fraction of the unique blocks replayed.
        limit: replay only the first ``limit`` requests (``None``: all).
        workers: concurrent replay processes (requests are dealt round-robin).
        speedup: 0 replays as fast as possible; else timestamps are divided by it.
        key_prefix: prepended to every block key.
        policy: master eviction policy (an ``cxlkv.eviction_policies`` name).
        low_watermark: eviction frees down to this fraction of capacity.
        ssd_fraction: embedded: an SSD tier holding this fraction of the unique
            blocks (0: none, CXL only).
        dram_fraction: embedded: a DRAM tier in each clientd holding this
            fraction of the unique blocks (0: none).
        promotion_threshold, dram_promotion_threshold: the master's (tiered runs).
        tier_high_watermark, tier_low_watermark: the CXL watermarks of tiered
            runs: demotion to SSD starts and stops there (CXL-only runs evict at
            1.0 down to ``low_watermark``).
        copy_ahead_watermark: the master's (tiered runs).
        reserve_ahead: embedded: the clientds take extents ahead of need (their
            default; one master round trip per put). ``False``: PutStart/PutEnd, and
            no region space held in reserve (the committed capacity is exactly the
            simulations').
        prefault: each worker faults in its own mapping of the region before the
            timed part (``Client(direct_prefault=True)``), as the embedded
            clientds do theirs: the replay then measures no first-touch page
            faults (otherwise one per 4 KiB page of a ``/dev/shm`` region, in
            every worker). ``False`` for a region too large to map page by page
            (the CLI's default with ``--socket``).
    """

    trace_path: str = DEFAULT_TRACE
    block_bytes: int = 64 * KiB
    capacity_fraction: float = 0.1
    limit: int | None = None
    workers: int = 4
    speedup: float = 0.0
    key_prefix: str = "blk/"
    policy: str = "arc"
    low_watermark: float = 0.999
    ssd_fraction: float = 0.0
    dram_fraction: float = 0.0
    promotion_threshold: int = 1
    dram_promotion_threshold: int = 4
    tier_high_watermark: float = 0.995
    tier_low_watermark: float = 0.99
    copy_ahead_watermark: float = 0.5
    reserve_ahead: bool = True
    prefault: bool = True


@dataclass
class WorkerStats:
    """Per-worker counters, summed into the report."""

    requests: int = 0
    blocks: int = 0
    hit_blocks: int = 0
    dram_hit_blocks: int = 0
    cxl_hit_blocks: int = 0
    ssd_hit_blocks: int = 0
    tokens: int = 0
    hit_tokens: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    verified_blocks: int = 0
    put_blocks: int = 0
    already_present: int = 0
    put_conflicts: int = 0
    no_space: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)

    def merge(self, other: "WorkerStats") -> None:
        for name, value in asdict(other).items():
            if isinstance(value, list):
                getattr(self, name).extend(value)
            else:
                setattr(self, name, getattr(self, name) + value)


@dataclass
class ReplayReport:
    """The replay's outcome (``--json`` prints it as one record)."""

    requests: int
    blocks: int
    block_hit_rate: float
    dram_hit_rate: float
    cxl_hit_rate: float
    ssd_hit_rate: float
    token_hit_rate: float
    lru_sim_hit_rate: float
    policy_sim_hit_rate: float
    bound_hit_rate: float
    bytes_read: int
    bytes_written: int
    gbps: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int
    verified_blocks: int
    put_blocks: int
    no_space: int
    #: Seconds from the moment every worker had loaded the trace and connected
    #: until the last one finished (``requests_per_s`` and ``gbps`` use it).
    elapsed_s: float
    block_bytes: int
    capacity_fraction: float
    capacity_blocks: int
    unique_blocks: int
    clientds: int
    workers: int
    policy: str
    error_samples: list[str]
    limit_gbps: float | None = None
    ratio_to_limit: float | None = None
    ssd_fraction: float = 0.0
    dram_fraction: float = 0.0
    master_counters: dict[str, int] = field(default_factory=dict)
    #: Where ``capacity_blocks`` (the simulations' capacity) comes from: ``"region"``
    #: (an embedded cluster sized for it), ``"master"`` (a running cluster: its CXL
    #: segments' capacity from the master's Stat), ``"fraction"`` (a running cluster
    #: that could not be asked: ``capacity_fraction`` × unique blocks, not the store's
    #: capacity, so the simulations are not comparable with the store).
    capacity_source: str = "region"
    #: ``capacity_source == "master"``: the CXL segments' allocatable bytes.
    cxl_capacity_bytes: int = 0
    #: ``capacity_source == "master"``: the master's high watermark (the simulations
    #: evict only when full; a master evicting earlier keeps a little less).
    master_high_watermark: float = 1.0
    #: The offline optimum at the same capacity (Belady's MIN, :func:`simulate_belady`).
    belady_hit_rate: float = 0.0
    #: Every other registered eviction policy, simulated at the same capacity.
    other_sim_hit_rates: dict[str, float] = field(default_factory=dict)

    def _capacity_row(self) -> str:
        per = f"{self.block_bytes // KiB} KiB each"
        frac = self.capacity_blocks / self.unique_blocks if self.unique_blocks else 0.0
        if self.capacity_source == "master":
            return (f"{self.capacity_blocks:,} blocks = the cluster's CXL segments "
                    f"({self.cxl_capacity_bytes / MiB:,.1f} MiB, from the master) ÷ "
                    f"{region_bytes_for(1, self.block_bytes) - region_bytes_for(0, self.block_bytes):,} B "
                    f"per block extent = {frac:.3g} × {self.unique_blocks:,} unique, {per}"
                    + (f"; the master evicts from {self.master_high_watermark:g} full, the "
                       f"simulations only when full" if self.master_high_watermark < 1 else ""))
        if self.capacity_source == "fraction":
            return (f"NOT the store's: simulations at --capacity-fraction {self.capacity_fraction:g} × "
                    f"{self.unique_blocks:,} unique = {self.capacity_blocks:,} blocks (the master could "
                    f"not be asked); not comparable with the store's hit rate")
        return (f"{self.capacity_blocks:,} blocks = {self.capacity_fraction:g} × "
                f"{self.unique_blocks:,} unique, {per}"
                + (f"; SSD tier {self.ssd_fraction:g} ×" if self.ssd_fraction else "")
                + (f"; DRAM tier {self.dram_fraction:g} × per clientd" if self.dram_fraction else ""))

    def table(self) -> str:
        """Human-readable report."""
        from tabulate import tabulate

        pct = lambda x: f"{100 * x:.2f} %"  # noqa: E731
        rows = [
            ("requests", f"{self.requests:,}"),
            ("blocks requested", f"{self.blocks:,}"),
            ("block hit rate (store)", pct(self.block_hit_rate)),
            ("  served by DRAM / CXL / SSD", f"{pct(self.dram_hit_rate)} / {pct(self.cxl_hit_rate)} / "
                                            f"{pct(self.ssd_hit_rate)}"),
            ("  same policy, simulated", f"{pct(self.policy_sim_hit_rate)}  ({self.policy})"),
            ("  LRU, simulated", pct(self.lru_sim_hit_rate)),
            *((f"  {name}, simulated", pct(rate)) for name, rate in self.other_sim_hit_rates.items()),
            ("  Belady (offline optimum)", pct(self.belady_hit_rate)),
            ("  unbounded cache (bound)", pct(self.bound_hit_rate)),
            ("token hit rate", pct(self.token_hit_rate)),
            ("capacity", self._capacity_row()),
            ("bytes read / written", f"{self.bytes_read / MiB:,.0f} MiB / {self.bytes_written / MiB:,.0f} MiB"),
            ("throughput", f"{self.requests_per_s:,.0f} requests/s, {self.gbps:.2f} GB/s"
                           + (f" ({self.ratio_to_limit:.3f} × memcpy {self.limit_gbps:.1f} GB/s at "
                              f"{self.block_bytes // KiB} KiB)" if self.limit_gbps else "")),
            ("latency per request", f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms"),
            ("verified blocks", f"{self.verified_blocks:,}"),
            ("errors", f"{self.errors}"),
            ("elapsed", f"{self.elapsed_s:.1f} s ({self.clientds} clientds, {self.workers} workers)"),
        ]
        text = tabulate(rows, tablefmt="simple")
        if self.error_samples:
            text += "\nfirst errors:\n  " + "\n  ".join(self.error_samples[:5])
        return text


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[i]


# ------------------------------------------------------------------------- worker


def _replay_worker(
    worker: int,
    n_workers: int,
    socket_path: str,
    opts: ReplayOptions,
    start: Any,
    progress: Any,
    results: Any,
) -> None:
    """Replay requests ``worker, worker + n_workers, …`` through ``socket_path``.

    Loads the trace and connects first, then sets ``start.ready[worker]`` and waits
    for ``start.go``: the parent times the replay from there, without process
    start-up and trace loading. ``start.at`` is the monotonic start (for pacing).
    """
    # The parent handles Ctrl-C. This process started with SIGINT blocked
    # (:func:`sigint_held`): ignoring it discards one already pending, then it may
    # be unblocked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    # The parent stops workers with SIGTERM: exit through `finally`/`with`, so the
    # SDK unlinks a shared buffer it was creating and closes its connections.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    from cxlkv.client import Client
    from cxlkv.errors import AlreadyExists, CxlkvError, NoSpace, NotReady

    stats = WorkerStats()
    try:
        trace = load_trace(opts.trace_path, opts.limit)
        mine = trace[worker::n_workers]
        B = opts.block_bytes
        max_blocks = max((len(r.hash_ids) for r in mine), default=1)
        with Client(socket_path, buffer_pool_bytes=max(64 * MiB, 2 * max_blocks * B + MiB),
                    direct_prefault=opts.prefault) as client:
            buf = client.buffer(max_blocks * B)
            views = [buf[i * B:(i + 1) * B] for i in range(max_blocks)]
            start.ready[worker] = 1
            start.go.wait()
            start_at = start.at.value
            for req in mine:
                if opts.speedup > 0:
                    delay = start_at + req.timestamp_s / opts.speedup - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                ids = req.hash_ids
                n = len(ids)
                keys = [f"{opts.key_prefix}{h}" for h in ids]
                t0 = time.perf_counter()
                try:
                    tiers: list[int] = []
                    m = client.get_prefix_into(keys, views[:n], tiers)
                    for t in tiers:
                        if t == _CXL:
                            stats.cxl_hit_blocks += 1
                        elif t == _SSD:
                            stats.ssd_hit_blocks += 1
                        elif t == _DRAM:
                            stats.dram_hit_blocks += 1
                    for i, good in enumerate(verify_blocks(buf, ids[:m], B)):
                        if good:
                            stats.verified_blocks += 1
                        else:
                            stats.errors += 1
                            if len(stats.error_samples) < 5:
                                stats.error_samples.append(f"wrong bytes for block {ids[i]}")
                    if m < n:
                        fill_blocks(buf[m * B:], ids[m:], B)
                    if m < n:
                        for res in client.put_from_many(keys[m:], views[m:n]):
                            if res.ok:
                                stats.put_blocks += 1
                                stats.bytes_written += B
                            elif isinstance(res.error, AlreadyExists):
                                stats.already_present += 1
                            elif isinstance(res.error, NotReady):
                                stats.put_conflicts += 1  # another host is writing this block now
                            elif isinstance(res.error, NoSpace):
                                stats.no_space += 1
                            else:
                                stats.errors += 1
                                if len(stats.error_samples) < 5:
                                    stats.error_samples.append(f"put: {res.error!r}")
                except CxlkvError as exc:
                    m = 0
                    stats.errors += 1
                    if len(stats.error_samples) < 5:
                        stats.error_samples.append(repr(exc))
                stats.latencies_s.append(time.perf_counter() - t0)
                stats.requests += 1
                stats.blocks += n
                stats.hit_blocks += m
                stats.tokens += req.prefix_tokens(n)
                stats.hit_tokens += req.prefix_tokens(m)
                stats.bytes_read += m * B
                progress[worker] += 1
    except Exception as exc:  # report, never hang the parent
        stats.errors += 1
        stats.error_samples.append(f"worker {worker} stopped: {exc!r}")
    # Nothing is left to clean up: a SIGTERM from now on just ends the process
    # (raising SystemExit inside interpreter finalizers prints "Exception ignored").
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    start.ready[worker] = 1
    results.put(stats)


#: Longest wait for a replay worker to load the trace and connect, in seconds.
READY_TIMEOUT_S = 300.0


@dataclass
class _Start:
    """The start line shared with the workers: who is ready, the go signal, when."""

    ready: Any  # RawArray of bytes, one per worker
    go: Any  # Event
    at: Any  # RawValue double: time.monotonic() at go

    def wait_ready(self, procs: Sequence[Any], timeout_s: float = READY_TIMEOUT_S) -> list[int]:
        """Wait until every worker is ready (or has stopped), then start them all.

        A worker still alive but not ready after ``timeout_s`` seconds (stuck
        loading the trace or connecting) is terminated, so the replay cannot wait
        on it forever; it sends no report, which the caller counts as an error.

        Returns:
            The numbers of the workers terminated that way.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(r or not p.is_alive() for r, p in zip(self.ready, procs)):
                break
            time.sleep(0.01)
        late = [i for i, (r, p) in enumerate(zip(self.ready, procs)) if not r and p.is_alive()]
        for i in late:
            procs[i].terminate()
        self.at.value = time.monotonic()
        self.go.set()
        return late


# --------------------------------------------------------------------------- main
@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Hold Ctrl-C while helper processes start; raise it, if one came, on leaving.

    A terminal's Ctrl-C reaches the whole process group, and only the replay's
    main process handles it (stopping the workers, then the cluster). Worker
    processes must not take it while they start (a KeyboardInterrupt traceback in
    a half-started interpreter): SIGINT is blocked here, and a blocked signal mask
    is inherited across fork and exec, so each worker starts with it blocked,
    then ignores it and unblocks it (:func:`_replay_worker`). The main process
    never sets SIGINT to SIG_IGN: that would discard a Ctrl-C already pending
    (POSIX; e.g. one that arrived while ``fork`` had every signal blocked), and
    the replay ran on. A pending Ctrl-C is raised when the mask is restored.
    multiprocessing's resource tracker is started first: starting it unblocks
    SIGINT (CPython's ``resource_tracker.ensure_running``), which inside the
    window would let a Ctrl-C reach the workers still starting. Outside the main
    thread (no signals there) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a pending Ctrl-C is raised here




def run_replay(
    opts: ReplayOptions,
    socket_paths: Sequence[str],
    *,
    show_progress: bool = False,
    capacity_blocks: int | None = None,
) -> ReplayReport:
    """Replay a trace against running clientds and build the report.

    Args:
        opts: what to replay.
        socket_paths: the clientds' sockets (workers are spread across them, one host each).
        show_progress: draw a progress bar on stderr.
        capacity_blocks: the cache capacity the store was given (for the simulations);
            ``None`` (a running cluster) asks the master (:func:`cluster_capacity`),
            else falls back to ``opts.capacity_fraction`` and labels the report so.

    Raises:
        FileNotFoundError / ValueError: unreadable trace.
        KeyboardInterrupt: Ctrl-C (workers are stopped first).
    """
    trace = load_trace(opts.trace_path, opts.limit)
    uniq = unique_blocks(trace)
    source, cxl_bytes, high_wm = "region", 0, 1.0
    policy, low_wm = opts.policy, opts.low_watermark
    if capacity_blocks is None:
        found = cluster_capacity(socket_paths[0], opts.block_bytes)
        if found is None:
            source, cap = "fraction", max(1, int(opts.capacity_fraction * uniq))
        else:
            source = "master"
            cap, cxl_bytes, policy, low_wm, high_wm = found
    else:
        cap = capacity_blocks
    ctx = mp.get_context("spawn")
    n_workers = max(1, min(opts.workers, len(trace)))
    procs: list[Any] = []
    total = WorkerStats()
    reported = False
    try:
        with sigint_held():
            progress = ctx.RawArray("q", n_workers)
            results = ctx.Queue()
            start = _Start(ctx.RawArray("b", n_workers), ctx.Event(), ctx.RawValue("d", 0.0))
            for w in range(n_workers):
                procs.append(ctx.Process(
                    target=_replay_worker,
                    args=(w, n_workers, socket_paths[w % len(socket_paths)], opts, start, progress, results),
                    name=f"replay-{w}",
                    daemon=True,
                ))
                procs[-1].start()
        late = start.wait_ready(procs)  # timed from here: no process start-up, no trace loading
        total.error_samples.extend(f"replay worker {i} was not ready after {READY_TIMEOUT_S:.0f} s: stopped"
                                   for i in late)
        t0 = time.perf_counter()
        got = 0
        t_end = None
        bar = click.progressbar(length=len(trace), label="replaying", file=sys.stderr) if show_progress else None
        done_shown = 0
        while got < n_workers:
            try:
                total.merge(results.get(timeout=0.2))
                got += 1
                t_end = time.perf_counter()  # the last report: the replay's end
            except Exception:  # queue.Empty: check the workers are alive
                if not any(p.is_alive() for p in procs) and results.empty():
                    total.errors += n_workers - got
                    total.error_samples.append("a replay worker died without a report")
                    break
            if bar is not None:
                done = sum(progress)
                bar.update(done - done_shown)
                done_shown = done
        if bar is not None:
            bar.update(len(trace) - done_shown)
            bar.render_finish()
        reported = True
    finally:
        for p in procs:
            if reported:  # all done: let each exit by itself (a SIGTERM while it
                p.join(5)  # exits would interrupt its finalizers, noisily)
            if p.is_alive():
                p.terminate()
            p.join(5)
    elapsed = (t_end if t_end is not None else time.perf_counter()) - t0
    lat = sorted(total.latencies_s)
    lru = simulate(trace, cap, policy="lru_builtin", low_watermark=low_wm)
    try:
        same = simulate(trace, cap, policy=policy, low_watermark=low_wm)
    except Exception:  # master package's policy unavailable: report LRU
        same = lru
    others: dict[str, float] = {}
    try:
        from cxlkv.master.eviction import available_policies

        for name in available_policies():
            if name not in (policy, "lru"):
                others[name] = simulate(trace, cap, policy=name, low_watermark=low_wm).block_hit_rate
    except Exception:  # master package unavailable: no other policies to show
        pass
    belady = simulate_belady(trace, cap)
    bound = simulate_unbounded(trace)
    busy_s = max(elapsed, 1e-9)
    gbps = (total.bytes_read + total.bytes_written) / busy_s / 1e9
    from cxlkv.bench.common import measure_memcpy_gbps

    limit = measure_memcpy_gbps(opts.block_bytes, runs=3)  # the physical limit, same run
    nb = total.blocks or 1
    return ReplayReport(
        requests=total.requests,
        blocks=total.blocks,
        block_hit_rate=total.hit_blocks / total.blocks if total.blocks else 0.0,
        dram_hit_rate=total.dram_hit_blocks / nb,
        cxl_hit_rate=total.cxl_hit_blocks / nb,
        ssd_hit_rate=total.ssd_hit_blocks / nb,
        token_hit_rate=total.hit_tokens / total.tokens if total.tokens else 0.0,
        lru_sim_hit_rate=lru.block_hit_rate,
        policy_sim_hit_rate=same.block_hit_rate,
        bound_hit_rate=bound.block_hit_rate,
        bytes_read=total.bytes_read,
        bytes_written=total.bytes_written,
        gbps=gbps,
        requests_per_s=total.requests / busy_s,
        p50_ms=_percentile(lat, 0.50) * 1e3,
        p99_ms=_percentile(lat, 0.99) * 1e3,
        errors=total.errors,
        verified_blocks=total.verified_blocks,
        put_blocks=total.put_blocks,
        no_space=total.no_space,
        elapsed_s=elapsed,
        block_bytes=opts.block_bytes,
        capacity_fraction=opts.capacity_fraction,
        capacity_blocks=cap,
        unique_blocks=uniq,
        clientds=len(socket_paths),
        workers=n_workers,
        policy=policy,
        error_samples=total.error_samples[:10],
        limit_gbps=limit,
        ratio_to_limit=gbps / limit if limit else None,
        ssd_fraction=opts.ssd_fraction,
        dram_fraction=opts.dram_fraction,
        capacity_source=source,
        cxl_capacity_bytes=cxl_bytes,
        master_high_watermark=high_wm,
        belady_hit_rate=belady.block_hit_rate,
        other_sim_hit_rates=others,
    )


def cluster_capacity(socket_path: str, block_bytes: int) -> tuple[int, int, str, float, float] | None:
    """A running cluster's block capacity, as the master states it.

    Asks the clientd at ``socket_path`` for the master's address, then the master's
    Stat: the capacity is the mounted CXL segments' allocatable bytes divided by one
    block's extent (object header, key and value, aligned: :func:`region_bytes_for`).
    SSD and DRAM tiers are not counted (the simulations model the CXL tier).

    Returns:
        ``(capacity_blocks, cxl_capacity_bytes, eviction_policy, low_watermark,
        high_watermark)``,
        or ``None`` when the clientd or the master cannot be asked.
    """
    import grpc

    from cxlkv import Client
    from cxlkv.errors import CxlkvError
    from cxlkv.v1 import common_pb2, master_pb2, master_pb2_grpc

    try:
        with Client(socket_path) as c:
            address = c.stat().get("master_address", "")
    except (CxlkvError, OSError):
        return None
    if not address:
        return None
    try:
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as ch:
            st = master_pb2_grpc.MasterServiceStub(ch).Stat(master_pb2.StatRequest(), timeout=10)
    except grpc.RpcError:
        return None
    cxl = sum(s.capacity_bytes for s in st.segments if s.tier == common_pb2.CXL and s.mounted)
    extent = region_bytes_for(1, block_bytes) - region_bytes_for(0, block_bytes)
    if cxl < extent:
        return None
    low = st.low_watermark if 0 < st.low_watermark < 1 else 1.0
    return cxl // extent, cxl, st.eviction_policy or "lru", low, st.high_watermark or 1.0


#: Bytes before each block's value in its extent: the 64-byte object header and
#: the key (``blk/<id>``, under 64 bytes) padded to 64 (:func:`cxlkv.layout.objheader.header_bytes_for`).
BLOCK_HEADER_BYTES = 128


def region_bytes_for(capacity_blocks: int, block_bytes: int, alignment_bytes: int = 64,
                     header_bytes: int = BLOCK_HEADER_BYTES, *, index: bool = False) -> int:
    """Region size (header included) whose allocatable space holds exactly
    ``capacity_blocks`` blocks of ``block_bytes`` (each extent: object header,
    key and value, aligned). With ``index`` the region also holds a committed-object
    index sized for ``capacity_blocks`` objects (format it with that
    ``expected_objects``), and the 4096-byte alignment of the index's offset."""
    from cxlkv.layout.region import REGION_HEADER_BYTES

    extent = -(-(block_bytes + header_bytes) // alignment_bytes) * alignment_bytes
    size = REGION_HEADER_BYTES + capacity_blocks * extent
    if index:
        from cxlkv.layout.index import index_geometry

        size += index_geometry(1 << 62, capacity_blocks).index_bytes + 4096
    return size


def reserve_headroom_blocks(block_bytes: int, clientds: int, *, ssd: bool = False,
                            capacity_blocks: int = 0, writers: int = 0) -> int:
    """Blocks of region space the clientds' reserved extents take (and committed
    blocks cannot use): each clientd holds up to its pool's bound of extents of one
    size ahead of need (clientd/reserve.py: ``RESERVE_MAX_EXTENTS``, ``RESERVE_BYTES``
    and the budget, at most ``CAPACITY_SHARE`` of a ``capacity_blocks`` cache), on
    average three quarters of that (a stack is refilled to its target when half
    empty); each of ``writers`` direct-commit writer processes holds up to
    :data:`~cxlkv.client._commit.AHEAD` more (docs/sdk.md "Direct commit"). None
    with an SSD tier (no reservations are taken there). The embedded region adds
    this to the capacity so the committed capacity is the simulations'."""
    if ssd:
        return 0
    from cxlkv.clientd.reserve import (CAPACITY_SHARE, MAX_RESERVED_BYTES, RESERVE_BUDGET_BYTES,
                                       RESERVE_BYTES, RESERVE_MAX_EXTENTS)

    extent = region_bytes_for(1, block_bytes) - region_bytes_for(0, block_bytes)
    if extent > MAX_RESERVED_BYTES:
        return 0
    budget = min(RESERVE_BYTES, RESERVE_BUDGET_BYTES)
    if capacity_blocks:
        budget = min(budget, int(capacity_blocks * extent * CAPACITY_SHARE))
    from cxlkv.client._commit import AHEAD, AHEAD_BYTES

    pools = clientds * (3 * max(1, min(RESERVE_MAX_EXTENTS, budget // extent)) // 4)
    return pools + writers * min(AHEAD, AHEAD_BYTES // extent)


def run_embedded(
    opts: ReplayOptions,
    *,
    clientds: int = 2,
    show_progress: bool = False,
    run_dir: str | None = None,
    tls: bool = False,
) -> ReplayReport:
    """Start a local cluster sized for ``opts``, replay, stop it (also on Ctrl-C).

    With ``tls`` the cluster's links to the master run over mutual TLS
    (generated certificates, :class:`~cxlkv.deploy.cluster.LocalCluster`).

    The region holds ``capacity_fraction × unique blocks`` blocks; the master
    evicts with ``opts.policy`` on allocation failure down to ``opts.low_watermark``.
    With ``opts.ssd_fraction`` an SSD tier file (in the run directory, on disk) and
    with ``opts.dram_fraction`` a DRAM tier per clientd are added; the CXL region
    then demotes between ``opts.tier_high_watermark`` and ``opts.tier_low_watermark``.
    The report carries the master's counters at the end (``master_counters``).
    """
    from cxlkv.deploy.cluster import LocalCluster

    trace = load_trace(opts.trace_path, opts.limit)
    uniq = unique_blocks(trace)
    cap = max(1, int(opts.capacity_fraction * uniq))
    del trace
    tmp = tempfile.TemporaryDirectory(prefix="cxlkv-replay-") \
        if run_dir is None else None
    master_options: dict[str, Any] = {
        "eviction_policy": opts.policy,
        "high_watermark": 1.0,
        "low_watermark": opts.low_watermark,
        "log_level": "warning",
    }
    clientd_options: dict[str, Any] = {"prefault": True, "log_level": "warning"}
    if not opts.reserve_ahead:
        clientd_options["reserve_ahead"] = False
    ssd_bytes = 0
    if opts.ssd_fraction or opts.dram_fraction:
        master_options.update(
            high_watermark=opts.tier_high_watermark, low_watermark=opts.tier_low_watermark,
            promotion_threshold=opts.promotion_threshold,
            dram_promotion_threshold=opts.dram_promotion_threshold if opts.dram_fraction else 0,
            copy_ahead_watermark=opts.copy_ahead_watermark,
            evict_budget_s=0.02, sweep_interval_s=0.05,
        )
    if opts.ssd_fraction:
        ssd_bytes = region_bytes_for(max(1, int(opts.ssd_fraction * uniq)), opts.block_bytes)
    if opts.dram_fraction:
        clientd_options["dram_tier_bytes"] = max(1 << 20, region_bytes_for(
            max(1, int(opts.dram_fraction * uniq)), opts.block_bytes))
    cluster = LocalCluster(
        run_dir or tmp.name,  # type: ignore[union-attr]
        clientds=clientds,
        region_size_bytes=region_bytes_for(cap + reserve_headroom_blocks(
            opts.block_bytes, clientds, ssd=bool(opts.ssd_fraction) or not opts.reserve_ahead,
            capacity_blocks=cap, writers=opts.workers),
            opts.block_bytes, index=True),
        index_objects=cap,
        master_options=master_options,
        clientd_options=clientd_options,
        ssd_size_bytes=ssd_bytes,
        tls=tls,
    )
    try:
        cluster.start()
        report = run_replay(opts, cluster.socket_paths, show_progress=show_progress, capacity_blocks=cap)
        report.master_counters = _master_counters(cluster.master_address,
                                                  cluster.tls_files("admin") if tls else None)
        return report
    finally:
        cluster.stop()
        if tmp is not None:
            tmp.cleanup()


def _master_counters(address: str, tls: Any = None) -> dict[str, int]:
    """The master's counters (Stat; mutual TLS with ``tls``), or ``{}`` when it cannot be asked."""
    import grpc

    from cxlkv.cli.admin import master_channel
    from cxlkv.v1 import master_pb2, master_pb2_grpc

    try:
        with master_channel(address, tls) as ch:
            st = master_pb2_grpc.MasterServiceStub(ch).Stat(master_pb2.StatRequest(), timeout=10)
    except grpc.RpcError:
        return {}
    return dict(st.counters)


@click.command("replay")
@click.argument("trace", type=click.Path(dir_okay=False), default=None, required=False)
@click.option("--embedded", is_flag=True, help="Start and stop a local cluster (master + clientds on /dev/shm).")
@click.option("--socket", "sockets", multiple=True, help="clientd socket(s) of a running cluster (repeat per host).")
@click.option("--block-bytes", default="64KiB", show_default=True, type=Size(min_bytes=1),
              help="Bytes per 512-token block.")
@click.option("--capacity-fraction", default=0.1, show_default=True, type=float,
              help="Embedded: cache capacity as a fraction of the trace's unique blocks (sizes the region); "
                   "with --socket the capacity is the running cluster's, asked from the master.")
@click.option("--clientds", default=2, show_default=True, type=click.IntRange(min=1), help="Embedded: clientd processes (hosts).")
@click.option("--workers", "--concurrency", default=4, show_default=True, type=click.IntRange(min=1),
              help="Concurrent replay processes, spread across the clientds.")
@click.option("--speedup", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Pace by timestamps divided by this factor; 0 = as fast as possible.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Replay only the first N requests.")
@click.option("--policy", default="arc", show_default=True, help="Eviction policy (embedded cluster).")
@click.option("--ssd-fraction", default=0.0, show_default=True, type=float,
              help="Embedded: add an SSD tier holding this fraction of the unique blocks (docs/tiers.md).")
@click.option("--dram-fraction", default=0.0, show_default=True, type=float,
              help="Embedded: add a DRAM tier per clientd holding this fraction of the unique blocks.")
@click.option("--key-prefix", default="blk/", show_default=True, help="Prefix of every block key.")
@click.option("--tls", is_flag=True, help="Embedded: run the cluster's links to the master over mutual TLS.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON record.")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the JSON record here.")
@click.option("--prefault/--no-prefault", default=None,
              help="Each worker faults in its mapping of the region before the timed part "
                   "[default: on with --embedded, off with --socket: a running cluster's region "
                   "may be too large to map page by page].")
def replay_cmd(trace, embedded, sockets, block_bytes, capacity_fraction, clientds, workers, speedup,
               limit, policy, ssd_fraction, dram_fraction, key_prefix, tls, as_json, out, prefault) -> None:
    """Replay a KV-cache trace: longest cached prefix, fetch + verify hits, put misses.

    TRACE defaults to the Mooncake conversation trace in ../shared/traces/ beside
    the checkout (then beside the current directory).
    """
    from cxlkv.errors import CxlkvError

    try:
        trace = resolve_trace(trace)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    if not 0 < capacity_fraction <= 1:
        raise click.ClickException("--capacity-fraction must be in (0, 1]")
    bb = block_bytes
    opts = ReplayOptions(
        trace_path=trace, block_bytes=bb, capacity_fraction=capacity_fraction, limit=limit,
        workers=workers, speedup=speedup, key_prefix=key_prefix, policy=policy,
        ssd_fraction=ssd_fraction, dram_fraction=dram_fraction,
        prefault=embedded if prefault is None else prefault,
    )
    progress = sys.stderr.isatty() and not as_json
    try:
        if embedded:
            report = run_embedded(opts, clientds=clientds, show_progress=progress, tls=tls)
        else:
            if not sockets:
                env = os.environ.get("CXLKV_SOCKET")
                if not env:
                    raise click.ClickException("give --embedded, or --socket PATH of a running clientd")
                sockets = (env,)
            report = run_replay(opts, list(sockets), show_progress=progress)
    except CxlkvError as exc:
        raise click.ClickException(f"{exc.code.name}: {exc}") from None
    except TraceError as exc:
        raise click.ClickException(str(exc)) from None
    record = {"bench": "replay", **asdict(report)}
    if out:
        Path(out).write_text(json.dumps(record, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(record, indent=2))
    else:
        click.echo(report.table())
    if report.errors:
        sys.exit(1)
