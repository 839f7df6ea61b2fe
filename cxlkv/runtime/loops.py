"""The daemons' event loop: uvloop (libuv, written in C) or the standard library's.

``event_loop`` in the master's and clientd's configuration picks it; uvloop is the
default. Each request to a daemon passes through its loop several times (frame
read, task start, master answer, reply write), and the standard loop's
``_run_once`` is Python: on the 2-vCPU machine of docs/benchmarks.md uvloop took
one 1-key BatchExist round trip (SDK → clientd → master and back) from 1,811 to
2,429 calls/s, with clientd CPU per call 320 → 220 µs and the master's 160 → 120 µs.

:class:`StallMonitor` measures how long the loop is held: a task that asks to wake
every ``interval_s`` and records how late it wakes (the stall: the longest time
no callback could run). Both daemons export it (``cxlkv_event_loop_stall_seconds``
and ``cxlkv_event_loop_stall_max_seconds``, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable, Coroutine, TypeVar

from cxlkv.errors import ConfigError

__all__ = ["EVENT_LOOPS", "loop_factory", "run", "StallMonitor", "STALL_BUCKETS_S"]

T = TypeVar("T")

#: Accepted values of the ``event_loop`` configuration key.
EVENT_LOOPS = ("uvloop", "asyncio")


def loop_factory(event_loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop constructor for ``event_loop`` (``None``: asyncio's default).

    Raises:
        ConfigError: an unknown name, or ``"uvloop"`` without the uvloop package
            installed (it is a dependency on Linux; set ``event_loop = "asyncio"``
            where it is missing).
    """
    if event_loop == "asyncio":
        return None
    if event_loop != "uvloop":
        raise ConfigError(f"event_loop: must be one of {', '.join(EVENT_LOOPS)}, got {event_loop!r}")
    try:
        import uvloop
    except ImportError as exc:
        raise ConfigError(
            f"event_loop = \"uvloop\" but uvloop cannot be imported ({exc}): "
            "install it (pip install uvloop) or set event_loop = \"asyncio\"") from None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


def run(main: Coroutine[Any, Any, T], event_loop: str) -> T:
    """Run ``main`` to completion on a fresh loop of kind ``event_loop``
    (like :func:`asyncio.run`: the loop is closed afterwards).

    Raises:
        ConfigError: see :func:`loop_factory` (``main`` is closed unrun).
        Whatever ``main`` raises.
    """
    try:
        factory = loop_factory(event_loop)
    except ConfigError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


#: Upper bounds of the stall histogram, in seconds (1 ms … 10 s).
STALL_BUCKETS_S: tuple[float, ...] = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class StallMonitor:
    """The event loop's stalls: how late a periodic wake-up comes.

    A task sleeps ``interval_s`` at a time; each time it wakes, the delay past
    its deadline is one observation (0 when the loop was free). A call that holds
    the loop for 2 s shows as a 2 s observation (at most ``interval_s`` is
    hidden inside a sleep).

    Args:
        interval_s: how often the task wakes, in seconds.
        window_s: :attr:`max_s` is the longest stall of the last ``window_s`` seconds.
        clock: monotonic clock in seconds (tests pass their own).

    Attributes:
        histogram: every observation, in seconds (:class:`cxlkv.runtime.metrics.Histogram`).
        max_s: the longest stall of the last ``window_s`` seconds (updated at each
            observation; a plain float, safe to read from the metrics thread).
        max_ever_s: the longest stall since start, in seconds.

    Thread-safety: :meth:`observe` and :meth:`run` on the loop's thread only;
    the attributes may be read from any thread.
    """

    def __init__(self, interval_s: float = 0.05, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from cxlkv.runtime.metrics import Histogram

        self.interval_s = interval_s
        self.window_s = window_s
        self.clock = clock
        self.histogram = Histogram(STALL_BUCKETS_S)
        self.max_s = 0.0
        self.max_ever_s = 0.0
        self._recent: deque[tuple[float, float]] = deque()  # (time, stall), stalls decreasing
        self._task: asyncio.Task[None] | None = None

    def observe(self, stall_s: float, now: float) -> None:
        """Record one stall of ``stall_s`` seconds that ended at ``now``."""
        stall_s = max(0.0, stall_s)
        self.histogram.observe(stall_s)
        if stall_s > self.max_ever_s:
            self.max_ever_s = stall_s
        recent = self._recent
        while recent and recent[-1][1] <= stall_s:  # a sliding-window maximum
            recent.pop()
        recent.append((now, stall_s))
        horizon = now - self.window_s
        while recent[0][0] < horizon:
            recent.popleft()
        self.max_s = recent[0][1]

    async def run(self) -> None:
        """Wake every ``interval_s`` and record how late each wake-up was (runs until cancelled)."""
        clock = self.clock
        interval = self.interval_s
        while True:
            due = clock() + interval
            await asyncio.sleep(interval)
            now = clock()
            self.observe(now - due, now)

    def start(self) -> "asyncio.Task[None]":
        """Run :meth:`run` as a task of the running loop (call on its thread)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="stall-monitor")
        return self._task

    def stop(self) -> None:
        """Cancel the task started by :meth:`start`."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
