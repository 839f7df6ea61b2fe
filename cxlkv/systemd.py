"""systemd service notifications (``Type=notify``) without libsystemd.

The protocol is the one of sd_notify(3): a daemon started by systemd finds an
``AF_UNIX`` datagram socket in ``$NOTIFY_SOCKET`` (a path, or an abstract
address written with a leading ``@``) and sends newline-separated
``VARIABLE=value`` assignments to it, one datagram per notification:

* ``READY=1`` — start-up is finished (cxlkv: the port or sockets are bound,
  the regions mapped and the daemon serves);
* ``STATUS=…`` — one line of free text that ``systemctl status`` shows;
* ``STOPPING=1`` — the daemon began shutting down;
* ``WATCHDOG=1`` — keep-alive, due every ``$WATCHDOG_USEC`` microseconds when
  the unit sets ``WatchdogSec=`` (sd_watchdog_enabled(3): only for the process
  named by ``$WATCHDOG_PID`` when that is set). cxlkv sends it from the event
  loop at half that period, so a wedged loop stops the pings and systemd
  restarts the daemon.

Outside systemd (no ``$NOTIFY_SOCKET``) every call is a cheap no-op. The
PyPI ``sdnotify`` package does the same sending but has been unmaintained since
2017 and knows nothing of the watchdog variables, so these ~30 lines stand in.

Components receive a :class:`Notifier`; only the command line builds one from
the environment (:meth:`Notifier.from_env`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Mapping

__all__ = ["Notifier"]

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify(3) messages to one notification socket.

    Args:
        address: the ``$NOTIFY_SOCKET`` value (``""``: notifications disabled).
        watchdog_usec: ``$WATCHDOG_USEC`` (0: no watchdog).

    Thread-safety: :meth:`notify` may be called from any thread (one
    ``sendto`` per message).
    """

    def __init__(self, address: str = "", watchdog_usec: int = 0) -> None:
        self.address = address
        self.watchdog_usec = max(0, int(watchdog_usec))
        self._sock: socket.socket | None = None
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Notifier":
        """The notifier systemd asked for in ``env`` (pass ``os.environ``).

        ``WATCHDOG_USEC`` is honoured only when ``WATCHDOG_PID`` is unset or
        names this process (sd_watchdog_enabled(3)); malformed values disable
        the watchdog rather than failing the start.
        """
        usec = 0
        pid = env.get("WATCHDOG_PID", "")
        if not pid or pid == str(os.getpid()):
            try:
                usec = int(env.get("WATCHDOG_USEC", "0") or 0)
            except ValueError:
                usec = 0
        return cls(env.get("NOTIFY_SOCKET", ""), usec)

    @property
    def enabled(self) -> bool:
        """Whether a notification socket is configured."""
        return bool(self.address)

    @property
    def watchdog_interval_s(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings (half of ``WATCHDOG_USEC``), or ``None``."""
        if not self.enabled or not self.watchdog_usec:
            return None
        return self.watchdog_usec / 2e6

    def notify(self, *assignments: str) -> bool:
        """Send ``VARIABLE=value`` assignments as one datagram.

        Returns:
            Whether it was sent (``False`` outside systemd or when the socket
            refused it; a failure is logged once, never raised: systemd
            bookkeeping must not take the daemon down).
        """
        if not self.address or not assignments:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        message = "\n".join(a.replace("\n", " ") for a in assignments).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, target)
            return True
        except OSError as exc:
            if not self._warned:
                log.warning("cannot notify systemd at %s: %s", self.address, exc.strerror or exc)
                self._warned = True
            return False

    def ready(self, status: str = "") -> bool:
        """``READY=1`` (with ``STATUS=status`` when given)."""
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        """``STATUS=text``: one line for ``systemctl status``."""
        return self.notify(f"STATUS={text}")

    def stopping(self, status: str = "") -> bool:
        """``STOPPING=1`` (with ``STATUS=status`` when given)."""
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def watchdog(self) -> bool:
        """``WATCHDOG=1``: one keep-alive ping."""
        return self.notify("WATCHDOG=1")

    async def run_watchdog(self) -> None:
        """Ping ``WATCHDOG=1`` every :attr:`watchdog_interval_s` until cancelled.

        Runs on the daemon's event loop, so the pings stop when the loop is
        blocked. Returns at once when no watchdog was asked for.
        """
        interval = self.watchdog_interval_s
        if interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Close the sending socket (later calls reopen it)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
