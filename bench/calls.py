"""The per-call limit of this machine: what a call that does no work costs.

memcpy bandwidth is the limit for large values; a 4 KiB operation is bound by
the cost of one call between processes instead (docs/benchmarks.md). So the
``kv`` benchmark measures, in the same run and with the same number of caller
processes as its single-key 4 KiB figures, two ceilings:

* ``echo``: a uvloop server that writes every read back (an ``asyncio.Protocol``,
  no parsing) and callers doing a blocking ``sendall`` + ``recv`` of 32 bytes on
  a Unix socket. Python on both sides, nothing else: the floor any Python
  daemon pays per call on this machine (kernel wake-ups included).
* ``noop``: the daemon's own stack doing no work — a :class:`cxlkv.wire.lean.LeanFrameServer`
  on the daemon's event loop answering ClientService ``Exist`` from a coroutine
  (as clientd's routes are run) with a constant, and callers using the SDK's
  :class:`cxlkv.client._conn.LeanConnection`. The figure a clientd could reach if
  a Get cost nothing beyond its call: no master round trip, no copy, no check.

A record's ``ratio_to_call_limit`` is its ops/s over the ``noop`` ceiling.
Every server and caller is a process of its own (``spawn``), as in the figures
they stand beside.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
import time
from typing import Any

import numpy as np

__all__ = ["CallLimit", "KINDS", "measure_call_limit"]

#: The ceilings measured, in the order they are reported.
KINDS = ("echo", "noop")
#: Bytes each echo call sends (the size of a small lean request).
ECHO_BYTES = 32
#: Seconds a server or a caller may take to start before the measurement fails.
START_TIMEOUT_S = 60.0


class CallLimit:
    """One measured ceiling.

    Attributes:
        kind: ``"echo"`` or ``"noop"`` (see the module docstring).
        callers: caller processes.
        ops_per_s: calls per second, all callers together (first start to last end).
        p50_us: median latency of one call, microseconds.
    """

    __slots__ = ("kind", "callers", "ops_per_s", "p50_us")

    def __init__(self, kind: str, callers: int, ops_per_s: float, p50_us: float) -> None:
        self.kind = kind
        self.callers = callers
        self.ops_per_s = ops_per_s
        self.p50_us = p50_us

    def __repr__(self) -> str:
        return f"CallLimit({self.kind}, {self.callers} callers: {self.ops_per_s:,.0f}/s, p50 {self.p50_us:.0f} us)"


# ------------------------------------------------------------------ servers
def _serve(kind: str, path: str, event_loop: str, ready: Any) -> None:
    """Server process: serve ``kind`` on the Unix socket ``path`` until killed."""
    from cxlkv.runtime.loops import run

    run(_server_main(kind, path, ready), event_loop)


async def _server_main(kind: str, path: str, ready: Any) -> None:
    loop = asyncio.get_running_loop()
    server: Any
    if kind == "echo":
        class Echo(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.transport = transport

            def data_received(self, data: bytes) -> None:
                self.transport.write(data)

        # keep the server: uvloop closes the listener of a Server object that is
        # garbage-collected (callers then see ECONNREFUSED)
        server = await loop.create_unix_server(Echo, path)
    else:
        from cxlkv.client.framing import METHODS_BY_NAME
        from cxlkv.wire.lean import LeanFrameServer, LeanRoute
        from cxlkv.v1 import client_pb2

        m = METHODS_BY_NAME["Exist"]
        answer = client_pb2.ExistResponse(exists=True)

        async def exist(request: Any) -> Any:
            return answer

        server = LeanFrameServer({m.number: LeanRoute(m.name, m.request_type.FromString, exist, m.request_type)})
        await server.start_unix(path)
    ready.set()
    await asyncio.Event().wait()


# ------------------------------------------------------------------ callers
def _caller(kind: str, path: str, calls: int, barrier: Any, queue: Any) -> None:
    """Caller process: one connection, ``calls`` calls after the barrier; reports
    ``(start ns, end ns, latencies ns)`` or ``("err", message)``."""
    try:
        if kind == "echo":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
            msg = b"x" * ECHO_BYTES

            def one() -> None:
                sock.sendall(msg)
                got = 0
                while got < ECHO_BYTES:
                    n = len(sock.recv(ECHO_BYTES - got))
                    if not n:
                        raise ConnectionError("echo server closed the connection")
                    got += n
        else:
            from cxlkv.client._conn import LeanConnection
            from cxlkv.client.framing import METHODS_BY_NAME
            from cxlkv.v1 import client_pb2

            m = METHODS_BY_NAME["Exist"]
            conn = LeanConnection(path, START_TIMEOUT_S)
            request = client_pb2.ExistRequest(key="bench/call-limit")

            def one() -> None:
                conn.call(m, request)
        one()  # connected and warm
        barrier.wait(START_TIMEOUT_S)
        lat = np.empty(calls, dtype=np.int64)
        clock = time.perf_counter_ns
        t0 = prev = clock()
        for i in range(calls):
            one()
            now = clock()
            lat[i] = now - prev
            prev = now
        queue.put((t0, prev, lat))
    except BaseException as exc:  # to the driver
        queue.put(("err", f"{type(exc).__name__}: {exc}", None))


def measure_call_limit(ctx: Any, kind: str, callers: int, calls_per_caller: int,
                       event_loop: str = "uvloop") -> CallLimit:
    """Measure one ceiling with ``callers`` caller processes.

    Args:
        ctx: a multiprocessing context (``spawn``).
        kind: ``"echo"`` or ``"noop"`` (module docstring).
        callers: caller processes (each one connection, one call at a time).
        calls_per_caller: timed calls each.
        event_loop: the server's loop (``"uvloop"`` or ``"asyncio"``, as the daemons' config).

    Raises:
        ValueError: unknown ``kind`` or counts below 1.
        RuntimeError: the server did not start or a caller failed.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown call limit {kind!r} (one of {', '.join(KINDS)})")
    if callers < 1 or calls_per_caller < 1:
        raise ValueError("callers and calls_per_caller must be at least 1")
    with tempfile.TemporaryDirectory(prefix="cxlkv-bench-calls-") as d:
        path = os.path.join(d, f"{kind}.sock")
        ready = ctx.Event()
        server = ctx.Process(target=_serve, args=(kind, path, event_loop, ready), daemon=True)
        server.start()
        procs: list[Any] = []
        try:
            if not ready.wait(START_TIMEOUT_S):
                raise RuntimeError(f"the {kind} server did not start within {START_TIMEOUT_S:g} s "
                                   f"(exit code {server.exitcode})")
            barrier = ctx.Barrier(callers)
            queue = ctx.Queue()
            procs = [ctx.Process(target=_caller, args=(kind, path, calls_per_caller, barrier, queue), daemon=True)
                     for _ in range(callers)]
            for p in procs:
                p.start()
            results = [queue.get(timeout=START_TIMEOUT_S + 600) for _ in procs]
        finally:
            for p in procs:
                p.join(10)
                if p.is_alive():
                    p.kill()
            server.kill()
            server.join(10)
    errors = [r[1] for r in results if r[0] == "err"]
    if errors:
        raise RuntimeError(f"{kind} caller failed: {errors[0]}")
    wall_ns = max(r[1] for r in results) - min(r[0] for r in results)
    lat = np.concatenate([r[2] for r in results])
    return CallLimit(kind, callers, callers * calls_per_caller / (wall_ns / 1e9), float(np.median(lat)) / 1e3)
