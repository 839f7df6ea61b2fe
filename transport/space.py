"""Reserve a region or tier file's blocks in its filesystem, or refuse it in one line.

An emulated region in ``/dev/shm`` or an SSD tier file is created sparse
(``ftruncate``): a file larger than its filesystem is accepted, and the first
write past the free space fails later — a mapped region with SIGBUS, which kills
the process; the SSD tier with ``ENOSPC``. :func:`reserve_file` makes that an
error at start instead: it compares the blocks the file still lacks with the
filesystem's free space (``statvfs``, so nothing is written when it cannot fit),
then allocates them (``posix_fallocate``: existing bytes are kept; holes become
zeroed blocks). :func:`check_fits` is the same test for a file not yet created.

DAX character devices and other non-regular files are left alone (their size
is the device's).

On tmpfs the reserved blocks are memory: a 64 GiB emulated region takes 64 GiB
of ``/dev/shm`` at once, not as it fills — the point of the check. A filesystem
that cannot reserve overwrites (btrfs, ZFS, thin provisioning) may still answer
``ENOSPC`` later; the SSD tier then answers ``NO_SPACE`` (docs/tiers.md).
"""

from __future__ import annotations

import errno
import os
import stat

from cxlkv.config import format_size
from cxlkv.errors import RegionError

__all__ = ["check_fits", "reserve_file"]


def _free_bytes(directory: str) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_fits(path: str, size_bytes: int, what: str = "region") -> None:
    """Refuse to create a file of ``size_bytes`` at ``path`` when its filesystem has less free space.

    Raises:
        RegionError: the file would not fit (both sizes named), or the directory
            cannot be examined.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    try:
        free = _free_bytes(directory)
    except OSError as exc:
        raise RegionError(f"{what} {path}: cannot examine {directory}: {exc.strerror or exc}", path=path,
                          errno=exc.errno or 0) from None
    if size_bytes > free:
        raise RegionError(
            f"{what} {path}: {format_size(size_bytes)} ({size_bytes} bytes) does not fit its filesystem "
            f"({directory}: {format_size(free)} free); choose a smaller size or a larger filesystem",
            path=path, errno=errno.ENOSPC)


def reserve_file(path: str, what: str = "region") -> int:
    """Allocate every block of the regular file ``path`` (up to its size), or refuse it.

    Idempotent (an allocated file costs one ``fstat`` and a cheap ``fallocate``);
    safe while other processes map or write the file (allocation never changes
    bytes already there).

    Returns:
        Bytes that had to be allocated (0 for a fully allocated file or a device).

    Raises:
        RegionError: the file's missing blocks exceed the filesystem's free space,
            or the allocation failed (one line naming the sizes and errno).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise RegionError(f"{what} {path}: {exc.strerror or exc}", path=path, errno=exc.errno or 0) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return 0
        missing = max(0, st.st_size - st.st_blocks * 512)
        if missing == 0:
            return 0
        try:
            free = os.fstatvfs(fd).f_bavail * os.fstatvfs(fd).f_frsize
        except OSError:
            free = None
        if free is not None and missing > free:
            raise RegionError(
                f"{what} {path}: {format_size(st.st_size)} ({st.st_size} bytes) does not fit its filesystem: "
                f"{format_size(missing)} still to allocate, {format_size(free)} free; choose a smaller size "
                f"or a larger filesystem", path=path, errno=errno.ENOSPC)
        try:
            os.posix_fallocate(fd, 0, st.st_size)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return 0  # cannot reserve here (glibc emulates where it can): checked by statvfs only
            raise RegionError(
                f"{what} {path}: cannot allocate its {format_size(st.st_size)} in its filesystem: "
                f"{exc.strerror or exc}", path=path, errno=exc.errno or 0) from None
        return missing
    finally:
        os.close(fd)
