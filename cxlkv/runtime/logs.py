"""Logging for the daemons: leveled, one line per event, optionally JSON lines.

An operator error (bad config, missing device, port in use) is logged as one
clear line; tracebacks are kept for bugs (``logger.exception``) and for ``debug``.

``SIGUSR1`` makes a daemon write every thread's Python stack to its log (stderr)
and go on (:mod:`faulthandler`): ``kill -USR1 $MAINPID`` shows where a daemon that
does not stop or answer is waiting (docs/operations.md).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
import time

__all__ = ["setup_logging", "JsonFormatter"]


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (RFC 3339, UTC), level, logger, msg, and any exc."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def setup_logging(level: str = "info", *, json_lines: bool = False, component: str = "cxlkv") -> logging.Logger:
    """Configure the root logger once for a daemon process.

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error``.
        json_lines: emit JSON lines instead of text.
        component: name shown in text lines (``master``, ``clientd-0``).

    Also makes ``SIGUSR1`` dump every thread's stack to stderr (the module's note).

    Returns:
        The ``cxlkv`` logger.
    """
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)-7s {component} %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("grpc").setLevel(max(root.level, logging.WARNING))
    return logging.getLogger("cxlkv")
