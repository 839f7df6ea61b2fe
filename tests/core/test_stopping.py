"""Bounded stops (cxlkv/runtime/stopping.py): the budget its steps share, and the
exit deadline behind them, in real processes and a real event loop."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time

from cxlkv.errors import Unavailable
from cxlkv.runtime.stopping import MIN_STEP_S, StopBudget

_HANGS = textwrap.dedent("""
    import logging, threading, time
    from cxlkv.runtime.stopping import arm_exit_deadline
    logging.basicConfig()
    threading.Thread(target=time.sleep, args=(600,), name="stuck-worker").start()  # not a daemon thread
    arm_exit_deadline(0.5, "test daemon", logging.getLogger("t"))
    print("armed", flush=True)
""")


def test_a_process_whose_exit_hangs_exits_1_at_its_deadline_with_every_threads_stack() -> None:
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _HANGS], capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t
    assert out.returncode == 1 and "armed" in out.stdout, (out.returncode, out.stderr)
    assert took < 10, took  # the interpreter's exit would have waited 600 s for the thread
    assert "the test daemon did not exit within 0.5 s of the stop signal" in out.stderr, out.stderr
    assert "Thread 0x" in out.stderr and "threading.py" in out.stderr, out.stderr  # the stuck thread's stack


def test_steps_share_the_budget_and_an_overrun_is_cancelled_and_named(caplog) -> None:
    log = logging.getLogger("cxlkv.test.stopping")
    budget = StopBudget(1.0, log)
    cancelled: list[str] = []

    async def hangs(name: str) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(name)
            raise

    async def fails() -> None:
        raise Unavailable("the master did not answer")

    async def main() -> list[tuple[bool, float]]:
        budget.start()
        out = []
        for step in (hangs("first"), fails(), hangs("third")):
            t = time.monotonic()
            out.append((await budget.step("a step", step), time.monotonic() - t))
        return out

    with caplog.at_level(logging.WARNING, logger=log.name):
        (ok1, t1), (ok2, _), (ok3, t3) = asyncio.run(main())
    assert not ok1 and not ok2 and not ok3 and cancelled == ["first", "third"]
    assert 0.9 <= t1 <= 1.5, t1  # the whole budget
    assert MIN_STEP_S - 0.1 <= t3 <= MIN_STEP_S + 0.5, t3  # spent: the least a step gets
    text = caplog.text
    assert "stopping: a step did not finish within 1.0 s; going on without it" in text
    assert "stopping: a step failed: the master did not answer" in text and "Traceback" not in text
