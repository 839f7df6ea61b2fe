"""Process identity: a pid plus its start time names one process across pid reuse.

Used by clientd (shared-buffer owners) and by ``cxlkv cluster`` (the processes a
``cluster.json`` records), so a recycled pid is never taken for the process that
once had it.
"""

from __future__ import annotations

__all__ = ["process_start_time", "process_state", "process_cmdline", "same_process"]


def _stat_fields(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` from field 3 on (after the parenthesised command name,
    which may contain spaces), or ``None`` if the process is gone."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot, or ``None`` if it is gone.

    Read from ``/proc/<pid>/stat`` (field 22); together with the pid it names a
    process uniquely across pid reuse. A zombie still has its start time.
    """
    rest = _stat_fields(pid)
    try:
        return int(rest[19]) if rest is not None else None  # field 22 overall; rest starts at field 3
    except (IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``Z``, …), or ``None`` if it is gone."""
    rest = _stat_fields(pid)
    return rest[0].decode("ascii", "replace") if rest else None


def process_cmdline(pid: int) -> str | None:
    """The command line of ``pid`` (arguments joined by spaces), or ``None`` if it is gone.

    A zombie has an empty command line.
    """
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def same_process(pid: int | None, start_time: int | None, *, cmdline_contains: str = "cxlkv") -> bool:
    """Whether ``pid`` is still the live (not zombie) process that was recorded.

    Args:
        pid: the recorded pid.
        start_time: its recorded start time (clock ticks, :func:`process_start_time`);
            ``None`` (a record from before start times were kept) checks the command
            line only.
        cmdline_contains: a string the command line must hold.

    Returns:
        True only if the pid runs, is not a zombie, has the recorded start time and
        its command line holds ``cmdline_contains``.
    """
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = process_start_time(pid)
    if now is None or (start_time is not None and now != start_time):
        return False
    if process_state(pid) in (None, "Z", "X"):
        return False
    cmd = process_cmdline(pid)
    return cmd is not None and cmdline_contains in cmd
