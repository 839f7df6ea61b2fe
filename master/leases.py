"""Read leases: time-bounded grants that keep one object version's bytes in place.

A lease pins one :class:`~cxlkv.master.objects.ObjectVersion`: while it lives,
the version is neither removed (without force) nor evicted, and its extents are
not reused even after a forced Remove or an Upsert — those only mark the version
REMOVED, and the master frees its extents when the last lease ends (the
``on_last_release`` callback). A lease ends at :meth:`LeaseTable.release` or at
its expiry, whichever is first.

The TTL is the same for every lease and ``now`` never goes back, so leases
expire in the order they were granted: the lease dict's insertion order is the
expiry order, and :meth:`LeaseTable.expire` walks it from the front and stops at
the first live lease — O(expired leases) amortised, never a scan of all leases,
and no second index to keep per lease.
"""

from __future__ import annotations

from typing import Callable

from cxlkv.master.objects import ObjectVersion

__all__ = ["Lease", "LeaseTable"]


class Lease:
    """One read lease.

    Attributes:
        lease_id: unique within a master run.
        obj: the leased version.
        expires_at: master clock, seconds.
        client_id: the holder ("" for anonymous readers).
    """

    __slots__ = ("lease_id", "obj", "expires_at", "client_id")

    def __init__(self, lease_id: int, obj: ObjectVersion, expires_at: float, client_id: str) -> None:
        self.lease_id = lease_id
        self.obj = obj
        self.expires_at = expires_at
        self.client_id = client_id


class LeaseTable:
    """Every live lease.

    Args:
        ttl_s: lease length in seconds.
        on_last_release: called with a version whose lease count dropped to 0.
        id_base: first lease id.

    Not thread-safe (master event-loop thread only).
    """

    def __init__(
        self, ttl_s: float, on_last_release: Callable[[ObjectVersion], None], id_base: int = 1
    ) -> None:
        self.ttl_s = ttl_s
        self._on_last_release = on_last_release
        self._next_id = id_base
        self._leases: dict[int, Lease] = {}  # insertion order == expiry order

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, lease_id: int) -> bool:
        return lease_id in self._leases

    def get(self, lease_id: int) -> Lease | None:
        """The live lease ``lease_id``, or ``None``."""
        return self._leases.get(lease_id)

    def grant(self, obj: ObjectVersion, client_id: str, now: float) -> Lease:
        """Grant a lease on ``obj`` until ``now + ttl_s``."""
        lease_id = self._next_id
        self._next_id = lease_id + 1
        expires_at = now + self.ttl_s
        lease = Lease(lease_id, obj, expires_at, client_id)
        self._leases[lease_id] = lease
        obj.leases += 1
        return lease

    def release(self, lease_id: int, client_id: str | None = None) -> bool:
        """End a lease early.

        Args:
            lease_id: the lease.
            client_id: when given, only a lease held by this client is released.

        Returns:
            True if a live lease was released; False for unknown, expired or
            another client's ids (ignored).
        """
        lease = self._leases.get(lease_id)
        if lease is None or (client_id is not None and lease.client_id != client_id):
            return False
        del self._leases[lease_id]
        self._end(lease.obj)
        return True

    def expire(self, now: float) -> int:
        """End every lease whose expiry is ``<= now``.

        Returns:
            Number of leases that expired.
        """
        leases = self._leases
        expired = []
        for lease in leases.values():
            if lease.expires_at > now:
                break
            expired.append(lease)
        for lease in expired:
            del leases[lease.lease_id]
            self._end(lease.obj)
        return len(expired)

    def _end(self, obj: ObjectVersion) -> None:
        obj.leases -= 1
        if obj.leases == 0:
            self._on_last_release(obj)

    def leases(self) -> list[Lease]:
        """Every live lease (a copy; for Stat and invariant checks)."""
        return list(self._leases.values())
