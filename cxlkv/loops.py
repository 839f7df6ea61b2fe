"""The daemons' event loop: uvloop (libuv, written in C) or the standard library's.

``event_loop`` in the master's and clientd's configuration picks it; uvloop is the
default. Each request to a daemon passes through its loop several times (frame
read, task start, master answer, reply write), and the standard loop's
``_run_once`` is Python: on the 2-vCPU machine of docs/benchmarks.md uvloop took
one 1-key BatchExist round trip (SDK → clientd → master and back) from 1,811 to
2,429 calls/s, with clientd CPU per call 320 → 220 µs and the master's 160 → 120 µs.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, TypeVar

from cxlkv.errors import ConfigError

__all__ = ["EVENT_LOOPS", "loop_factory", "run"]

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
