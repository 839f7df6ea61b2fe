"""What every cxlkv benchmark shares: the record, the timer, the memcpy limit, output.

Output convention (all benchmarks): a human table on stdout; with ``--json``
the JSON list of records on stdout instead; ``--out FILE`` also writes that
list to FILE. Each record has at least ``bench``, ``op``, ``size_bytes``,
``ops_per_s``, ``gbps``, ``p50_us``, ``p99_us``, ``limit_gbps`` and
``ratio_to_limit``; benchmark-specific fields (``batch``, ``concurrency``,
``path``, ``coherence``, ...) are added flat beside them.

Units: ``gbps`` is decimal gigabytes per second (1e9 bytes/s) of payload;
latencies are microseconds per operation; ``limit_gbps`` is the bandwidth of a
plain memcpy (:func:`measure_memcpy_gbps`, numpy ``np.copyto`` between two
pre-faulted buffers) of the same size measured in the same run, so
``ratio_to_limit`` says how close an operation comes to what the machine can do.

Fair measurement: every side of a comparison runs the same number of
operations per run on the same warm buffers, runs are interleaved, and the
reported throughput is the median over runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import mmap
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import IO, Any, TypeVar

import click
import numpy as np
from tabulate import tabulate

__all__ = [
    "Record",
    "Timing",
    "time_op",
    "ops_for",
    "measure_memcpy_gbps",
    "measure_cold_memcpy_gbps",
    "measure_written_memcpy_gbps",
    "memcpy_timing",
    "human_size",
    "print_table",
    "write_json",
    "emit",
    "output_options",
]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Fields every record carries, in table and JSON order.
BASE_FIELDS = (
    "bench", "op", "size_bytes", "ops_per_s", "gbps", "p50_us", "p99_us", "limit_gbps", "ratio_to_limit",
)


@dataclasses.dataclass
class Record:
    """One measured line.

    Attributes:
        bench: benchmark name (``"transport"``, ``"master"``, ...).
        op: what was measured (``"copy_in"``, ``"memcpy"``, ``"put"``, ...).
        size_bytes: payload bytes per operation.
        ops_per_s: operations per second (median over runs).
        gbps: payload GB/s (1e9 bytes/s) = size_bytes * ops_per_s / 1e9.
        p50_us: median latency of one operation, microseconds.
        p99_us: 99th-percentile latency of one operation, microseconds.
        limit_gbps: memcpy GB/s for ``size_bytes`` measured in the same run, or None.
        ratio_to_limit: gbps / limit_gbps, or None without a limit.
        extra: benchmark-specific fields, written flat beside the others
            (``batch``, ``concurrency``, ``path``, ``coherence``, ...).
    """

    bench: str
    op: str
    size_bytes: int
    ops_per_s: float
    gbps: float
    p50_us: float
    p99_us: float
    limit_gbps: float | None = None
    ratio_to_limit: float | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_timing(
        cls,
        bench: str,
        op: str,
        size_bytes: int,
        timing: Timing,
        limit_gbps: float | None = None,
        **extra: Any,
    ) -> Record:
        """Build a record from a :class:`Timing`; ``ratio_to_limit`` is computed."""
        gbps = size_bytes * timing.ops_per_s / 1e9
        ratio = gbps / limit_gbps if limit_gbps else None
        return cls(
            bench=bench,
            op=op,
            size_bytes=size_bytes,
            ops_per_s=timing.ops_per_s,
            gbps=gbps,
            p50_us=timing.p50_us,
            p99_us=timing.p99_us,
            limit_gbps=limit_gbps,
            ratio_to_limit=ratio,
            extra=dict(extra),
        )

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-ready dict: the base fields, then ``extra`` (which cannot override them)."""
        d: dict[str, Any] = {name: getattr(self, name) for name in BASE_FIELDS}
        for key, value in self.extra.items():
            if key in d:
                raise ValueError(f"extra field {key!r} would override a base field")
            d[key] = value
        return d


@dataclasses.dataclass(frozen=True)
class Timing:
    """Result of :func:`time_op`.

    Attributes:
        ops_per_s: median over runs of (operations / run wall time).
        p50_us: median per-operation latency over all runs, microseconds.
        p99_us: 99th-percentile per-operation latency, microseconds.
        run_ops_per_s: ops/s of each run, in order.
        ops_per_run: operations per run.
    """

    ops_per_s: float
    p50_us: float
    p99_us: float
    run_ops_per_s: tuple[float, ...]
    ops_per_run: int

    @classmethod
    def from_runs(cls, runs: Sequence[tuple[float, np.ndarray]]) -> Timing:
        """Combine ``(run_wall_s, per_op_latency_ns)`` pairs of equal op counts."""
        rates = tuple(len(lat) / wall for wall, lat in runs)
        lat_us = np.concatenate([lat for _, lat in runs]) / 1e3
        p50, p99 = np.percentile(lat_us, [50, 99])
        return cls(
            ops_per_s=statistics.median(rates),
            p50_us=float(p50),
            p99_us=float(p99),
            run_ops_per_s=rates,
            ops_per_run=len(runs[0][1]),
        )


def run_once(fn: Callable[[], object], ops: int) -> tuple[float, np.ndarray]:
    """Call ``fn`` ``ops`` times; return (wall seconds, per-call latencies in ns).

    Each call is timed with ``perf_counter_ns`` (about 0.1 µs of overhead per
    call, the same for every side of a comparison).
    """
    lat = np.empty(ops, dtype=np.int64)
    clock = time.perf_counter_ns
    start = clock()
    prev = start
    for i in range(ops):
        fn()
        now = clock()
        lat[i] = now - prev
        prev = now
    return (prev - start) / 1e9, lat


def time_op(fn: Callable[[], object], *, ops: int, runs: int = 5, warmup: int = 1) -> Timing:
    """Time ``runs`` runs of ``ops`` calls of ``fn`` after ``warmup`` untimed calls.

    Returns:
        The median throughput over runs and latency percentiles over all calls.

    Raises:
        ValueError: ``ops`` or ``runs`` below 1.
    """
    if ops < 1 or runs < 1:
        raise ValueError("ops and runs must be >= 1")
    for _ in range(warmup):
        fn()
    return Timing.from_runs([run_once(fn, ops) for _ in range(runs)])


def ops_for(size_bytes: int, *, bytes_per_run: int = 512 << 20, min_ops: int = 3, max_ops: int = 20_000) -> int:
    """Operations per run so one run moves about ``bytes_per_run`` bytes, clamped
    to ``[min_ops, max_ops]``."""
    return max(min_ops, min(max_ops, bytes_per_run // max(1, size_bytes)))


def _faulted(size_bytes: int) -> np.ndarray:
    """A page-aligned, pre-faulted buffer (anonymous mmap).

    Page alignment matters: malloc'd buffers at mismatched alignments send glibc's
    memcpy down a slow path on some CPUs (2.6 GB/s instead of ~30 GB/s at 64 KiB on
    this machine's AMD EPYC), which would understate the physical limit.
    """
    buf = np.frombuffer(mmap.mmap(-1, max(1, size_bytes)), dtype=np.uint8)[:size_bytes]
    buf.fill(0x5A)  # fault every page in before timing
    return buf


def memcpy_timing(
    dst: np.ndarray, src: np.ndarray, *, ops: int, runs: int = 5, warmup: int = 1
) -> Timing:
    """Time ``np.copyto(dst, src)`` (glibc memcpy for contiguous bytes) like :func:`time_op`."""
    return time_op(lambda: np.copyto(dst, src), ops=ops, runs=runs, warmup=warmup)


#: The source pool of :func:`measure_cold_memcpy_gbps`, bytes: several times any
#: last-level cache of the machines we run on (this one's L3 is 32 MiB).
COLD_POOL_BYTES = 256 << 20


def measure_cold_memcpy_gbps(size_bytes: int, *, runs: int = 3, pool_bytes: int = COLD_POOL_BYTES) -> float:
    """The memcpy bandwidth for ``size_bytes``-byte copies whose source is not in
    this core's caches, GB/s (1e9 B/s): the physical limit of a read of memory
    another process or host has just written, as a get of the region is.

    Each copy reads the next ``size_bytes`` of a pre-faulted ``pool_bytes`` pool
    (at least 8 copies' worth), round-robin, into one warm destination, so by the
    time a source comes round again it has left the caches. ``runs`` passes over
    the pool; the median pass.

    Raises:
        ValueError: ``size_bytes`` < 1.
    """
    if size_bytes < 1:
        raise ValueError("size_bytes must be >= 1")
    n = max(8, pool_bytes // size_bytes)
    pool = _faulted(n * size_bytes)
    dst = _faulted(size_bytes)
    next_src = itertools.cycle([pool[i * size_bytes:(i + 1) * size_bytes] for i in range(n)]).__next__

    def one() -> None:
        np.copyto(dst, next_src())

    timing = time_op(one, ops=n, runs=runs, warmup=n)
    return size_bytes * timing.ops_per_s / 1e9


def _written_slots(conn: Any, pool: mmap.mmap, size_bytes: int) -> None:
    """The writer of :func:`measure_written_memcpy_gbps` (a child process): for each
    slot number received, write that slot of ``pool`` with cached stores, then answer."""
    view = np.frombuffer(pool, dtype=np.uint8)
    src = np.full(size_bytes, 0xA5, dtype=np.uint8)
    while True:
        i = conn.recv()
        if i is None:
            return
        np.copyto(view[i * size_bytes:(i + 1) * size_bytes], src)
        conn.send(i)


def measure_written_memcpy_gbps(size_bytes: int, *, copies: int = 64, pool_bytes: int = 64 << 20) -> float:
    """The memcpy bandwidth for ``size_bytes``-byte copies of bytes another process
    has just written, GB/s (1e9 B/s): the physical limit of a get of a value another
    process put a moment ago on this host, whose lines are still modified in the
    writer core's cache (slower to read than memory out of cache: each line is
    fetched from the other core).

    A child process writes one slot of a shared ``pool_bytes`` pool at a time
    (cached stores); as soon as it has, this process copies that slot into a warm
    destination, timed. The median of ``copies`` copies.

    Raises:
        ValueError: ``size_bytes`` < 1.
    """
    import multiprocessing

    if size_bytes < 1:
        raise ValueError("size_bytes must be >= 1")
    n = max(2, pool_bytes // size_bytes)
    pool = mmap.mmap(-1, n * size_bytes)
    view = np.frombuffer(pool, dtype=np.uint8)
    view.fill(0x5A)
    dst = _faulted(size_bytes)
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    writer = ctx.Process(target=_written_slots, args=(theirs, pool, size_bytes), daemon=True)
    writer.start()
    times: list[float] = []
    try:
        for j in range(copies + 2):
            i = j % n
            mine.send(i)
            mine.recv()
            src = view[i * size_bytes:(i + 1) * size_bytes]
            t0 = time.perf_counter()
            np.copyto(dst, src)
            if j >= 2:  # two warm-up rounds
                times.append(time.perf_counter() - t0)
    finally:
        mine.send(None)
        writer.join(10)
        if writer.is_alive():
            writer.kill()
    return size_bytes / statistics.median(times) / 1e9


def measure_memcpy_gbps(
    size_bytes: int,
    *,
    ops: int | None = None,
    runs: int = 5,
    src: np.ndarray | None = None,
    dst: np.ndarray | None = None,
) -> float:
    """The memcpy bandwidth limit for ``size_bytes``-byte copies, GB/s (1e9 B/s).

    The same method for every benchmark: ``np.copyto`` between two pre-faulted,
    warm uint8 buffers (``src``/``dst`` when given, e.g. the very buffers the
    benchmark uses; else fresh ones), ``ops`` copies per run (default
    :func:`ops_for`), median over ``runs``. Copies up to a few MiB stay in the
    CPU caches, so they run well above DRAM bandwidth.

    Raises:
        ValueError: ``size_bytes`` < 1, or given buffers smaller than ``size_bytes``.
    """
    if size_bytes < 1:
        raise ValueError("size_bytes must be >= 1")
    src = _faulted(size_bytes) if src is None else src
    dst = _faulted(size_bytes) if dst is None else dst
    if src.nbytes < size_bytes or dst.nbytes < size_bytes:
        raise ValueError("src and dst must hold size_bytes bytes")
    s = src.reshape(-1).view(np.uint8)[:size_bytes]
    d = dst.reshape(-1).view(np.uint8)[:size_bytes]
    timing = memcpy_timing(d, s, ops=ops or ops_for(size_bytes), runs=runs)
    return size_bytes * timing.ops_per_s / 1e9


def human_size(size_bytes: int) -> str:
    """``4096`` → ``"4 KiB"``, ``3 << 20`` → ``"3 MiB"``, ``1000`` → ``"1000 B"``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size_bytes >= 1 << shift and size_bytes % (1 << shift) == 0:
            return f"{size_bytes >> shift} {unit}"
    return f"{size_bytes} B"


def _fmt(value: Any, digits: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def print_table(records: Iterable[Record], file: IO[str] | None = None, width: int | None = None) -> None:
    """Print records as aligned tables (tabulate) that fit ``width`` columns.

    Records are grouped (in order) by benchmark and by the extra fields they
    carry, one table per group, so one benchmark's extra columns do not widen
    another's; a group whose extras would pass ``width`` (default: the terminal's
    columns, 120 when not a terminal) continues in further tables keyed by
    op and size. Units are in the headers (``GB/s`` = 1e9 B/s, ``µs``).
    """
    import shutil

    records = list(records)
    width = width or (shutil.get_terminal_size((120, 24)).columns if (file or sys.stdout).isatty() else 120)
    groups: list[tuple[tuple[str, tuple[str, ...]], list[Record]]] = []
    for rec in records:
        sig = (rec.bench, tuple(k for k, v in rec.extra.items() if v is not None))
        if groups and groups[-1][0] == sig:
            groups[-1][1].append(rec)
        else:
            groups.append((sig, [rec]))
    out = file or sys.stdout
    for n, ((_, extra_keys), recs) in enumerate(groups):
        if n:
            print(file=out)
        key_cols = [[rec.bench, rec.op, human_size(rec.size_bytes)] for rec in recs]
        base = [[_fmt(rec.ops_per_s, 0), _fmt(rec.gbps, 2), _fmt(rec.p50_us, 1), _fmt(rec.p99_us, 1),
                 _fmt(rec.limit_gbps, 2), _fmt(rec.ratio_to_limit, 2)] for rec in recs]
        headers = ["bench", "op", "size", "ops/s", "GB/s", "p50 µs", "p99 µs", "limit GB/s", "ratio"]
        extras = [[_fmt(rec.extra.get(k), 2) for k in extra_keys] for rec in recs]
        # as many extra columns in the first table as fit; the rest continue below
        cols: list[list[str]] = [[]]
        for j, k in enumerate(extra_keys):
            trial = cols[-1] + [k]
            text = tabulate([kc + (b if len(cols) == 1 else []) + [e[extra_keys.index(x)] for x in trial]
                             for kc, b, e in zip(key_cols, base, extras)],
                            headers=headers[:3] + (headers[3:] if len(cols) == 1 else []) + trial,
                            disable_numparse=True, stralign="right")
            if cols[-1] and max(map(len, text.splitlines())) > width:
                cols.append([k])
            else:
                cols[-1] = trial
        for part, chunk in enumerate(cols):
            if part:
                print(file=out)
            rows = [kc + (b if part == 0 else []) + [e[extra_keys.index(x)] for x in chunk]
                    for kc, b, e in zip(key_cols, base, extras)]
            hdr = headers[:3] + (headers[3:] if part == 0 else []) + chunk
            print(tabulate(rows, headers=hdr, disable_numparse=True, stralign="right"), file=out)


def write_json(records: Iterable[Record], path: str | os.PathLike[str]) -> None:
    """Write the records as a JSON list to ``path`` atomically (temp file + rename);
    parent directories are created."""
    data = [r.to_dict() for r in records]
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".bench-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def emit(records: Sequence[Record], *, as_json: bool, out: str | None) -> None:
    """Apply the output convention: table or (``as_json``) JSON list on stdout;
    ``out`` also gets the JSON list."""
    if as_json:
        json.dump([r.to_dict() for r in records], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(records)
    if out:
        write_json(records, out)


def output_options(fn: _F) -> _F:
    """Click decorator adding the shared ``--json``, ``--out FILE`` and ``--quick`` options
    (passed as ``as_json``, ``out``, ``quick``)."""
    fn = click.option("--quick", is_flag=True, help="Fewer sizes and runs (a smoke run, not for reporting).")(fn)
    fn = click.option(
        "--out", type=click.Path(dir_okay=False), default=None, help="Also write the JSON list of records to FILE."
    )(fn)
    fn = click.option("--json", "as_json", is_flag=True, help="Print the JSON list of records instead of a table.")(fn)
    return fn
