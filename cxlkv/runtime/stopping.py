"""Bounded stops, shared by the master and clientd.

A daemon's stop has steps that wait on something outside it (the master, etcd, a
metrics server): each is given what is left of the stop's time
(:class:`StopBudget`), and one that overruns is cancelled and logged by name, so a
peer that does not answer (paused, partitioned) costs the stop its bound, not one
timeout per step. Behind the steps, :func:`arm_exit_deadline` is the last resort:
a process still up past its limit (an interpreter exit held by a library's thread
or an atexit hook) writes every thread's stack to its log and exits with code 1.
Both limits stay under the systemd units' ``TimeoutStopSec=`` (30 s,
deploy/systemd/), so the daemon, not systemd's SIGKILL, ends a stuck stop and
says where it was stuck.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Any, Awaitable

from cxlkv.errors import CxlkvError

__all__ = ["StopBudget", "arm_exit_deadline", "MIN_STEP_S"]

#: Least time a stop step gets, seconds, even when the budget is spent (a local
#: step such as closing a channel still gets to run).
MIN_STEP_S = 0.5


class StopBudget:
    """The seconds a stop's steps share.

    Args:
        limit_s: the whole stop's bound, seconds, counted from :meth:`start`.
        log: where overruns and failures are logged (the daemon's logger).
    """

    def __init__(self, limit_s: float, log: logging.Logger) -> None:
        self.limit_s = limit_s
        self.log = log
        #: Monotonic time by which the steps must be done (0.0: not started).
        self.deadline = 0.0

    def start(self) -> None:
        """Start counting (the stop signal); a second call changes nothing."""
        if not self.deadline:
            self.deadline = time.monotonic() + self.limit_s

    def left_s(self, cap_s: float | None = None) -> float:
        """Seconds the next step gets: what is left of the budget (all of it before
        :meth:`start`), at most ``cap_s``, at least :data:`MIN_STEP_S`."""
        left = max(MIN_STEP_S, self.deadline - time.monotonic()) if self.deadline else self.limit_s
        return left if cap_s is None else min(left, cap_s)

    async def step(self, what: str, step: Awaitable[Any], cap_s: float | None = None) -> bool:
        """Await ``step`` within :meth:`left_s`; one that overruns is cancelled and
        logged (``stopping: <what> did not finish within N s; going on without
        it``), one that fails is logged (a :class:`~cxlkv.errors.CxlkvError` as a
        warning line, anything else with its traceback: a bug). Never raises but
        for the caller's own cancellation.

        Returns:
            Whether the step finished without error.
        """
        left = self.left_s(cap_s)
        try:
            await asyncio.wait_for(step, left)
            return True
        except asyncio.TimeoutError:
            self.log.warning("stopping: %s did not finish within %.1f s; going on without it", what, left)
        except CxlkvError as exc:
            self.log.warning("stopping: %s failed: %s", what, exc)
        except Exception:  # a bug; stopping must go on
            self.log.exception("stopping: %s failed", what)
        return False


_armed: threading.Timer | None = None
_armed_lock = threading.Lock()


def arm_exit_deadline(limit_s: float, daemon: str, log: logging.Logger) -> threading.Timer:
    """Exit the process with code 1 if it is still up ``limit_s`` seconds from now,
    after logging ``<daemon> did not exit within N s of the stop signal`` and
    writing every thread's stack to stderr (the log). Armed once per process: a
    second stop signal keeps the first deadline.

    Returns:
        The timer (a daemon thread; cancel it to disarm).
    """
    def expire() -> None:
        log.error("the %s did not exit within %.1f s of the stop signal: exiting now; the threads' stacks "
                  "follow", daemon, limit_s)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(1)

    global _armed
    with _armed_lock:
        if _armed is None:
            _armed = threading.Timer(limit_s, expire)
            _armed.daemon = True
            _armed.start()
        return _armed
