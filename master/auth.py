"""Who may call what on the master: identities from certificates, client-id binding, admin calls.

With TLS on (``tls_*`` in MasterConfig), every caller of the master presents a
certificate the cluster CA signed (checked at the handshake, gRPC and lean
alike), and :class:`Authorizer` decides each call from the caller's
:class:`~cxlkv.wire.tls.Identity`:

* **client binding**: ``RegisterClient`` binds the client id it answers to the
  caller's identity (its certificate's CN). Every later call naming that client
  id (``client_id`` of heartbeats, puts, reads, lease releases, tier tasks; the
  ``previous_client_id`` of a re-registration) must come from the same identity,
  so one clientd can neither fence nor act as another. A re-registration naming
  an id no certificate has bound on this master (it restarted) gets a new id:
  the first caller after a restart cannot claim another daemon's.
* **admin calls** (:data:`ADMIN_METHODS`: RemoveAll, with or without a pattern,
  UnmountSegment, ListKeys; ReleaseQuarantine with ``writers_gone``, an operator's
  word; MountSegment of anything but the caller's own DRAM tier) need an
  admin identity: a certificate with ``OU=admin`` or a CN listed in
  ``admin_identities``. ``Stat`` answers everyone, but only an admin sees the
  client table (ids, hosts, metrics URLs) — :meth:`Authorizer.full_stat`.
* everything else (removal of named keys, existence, segment listing) is open to
  any identity the CA vouches for: they are the cluster's own parts.

Without TLS there is no identity and no check: the master then listens on
loopback only (or with ``allow_insecure``), see docs/operations.md "Security".

State apart from I/O: the authorizer sees the request message and the identity,
never a socket; it runs on the event-loop thread like the state it guards.
"""

from __future__ import annotations

from typing import Any, Iterable

from cxlkv.errors import PermissionDenied
from cxlkv.wire.tls import Identity
from cxlkv.v1 import common_pb2, master_pb2

__all__ = ["Authorizer", "ADMIN_METHODS"]

#: Methods only an admin identity may call.
ADMIN_METHODS = frozenset({"RemoveAll", "UnmountSegment", "ListKeys"})

_SERVICE = master_pb2.DESCRIPTOR.services_by_name["MasterService"]
#: Methods whose request names the caller's client id (``client_id`` field).
_CLIENT_BOUND = frozenset(m.name for m in _SERVICE.methods if "client_id" in m.input_type.fields_by_name)


class Authorizer:
    """Checks each master call against the caller's identity (TLS on).

    Args:
        admin_names: CNs granted the admin role besides ``OU=admin`` certificates.

    Not thread-safe: called on the master's event-loop thread.
    """

    def __init__(self, admin_names: Iterable[str] = ()) -> None:
        self.admin_names = frozenset(admin_names)
        #: client id → the identity name it is bound to.
        self._owner: dict[str, str] = {}

    def is_admin(self, who: Identity | None) -> bool:
        """Whether ``who`` may make the administrative calls."""
        return who is not None and (who.is_admin or who.name in self.admin_names)

    def check(self, method: str, request: Any, who: Identity | None) -> None:
        """Allow the call or raise.

        Args:
            method: the MasterService method name.
            request: its request message.
            who: the caller's identity (``None``: no certificate).

        Raises:
            PermissionDenied: no identity, an admin call from a non-admin, or a
                client id bound to another identity (the message names both).
        """
        if who is None:
            raise PermissionDenied(f"{method}: caller presented no client certificate")
        if method in ADMIN_METHODS or (method == "ReleaseQuarantine" and request.writers_gone):
            if not self.is_admin(who):
                raise PermissionDenied(f"{method} needs an admin identity; {who.name!r} is not one "
                                       "(a certificate with OU=admin, or a name in admin_identities)")
            return
        if method == "MountSegment" and not self.is_admin(who):
            if request.tier != common_pb2.DRAM or not request.client_id:
                raise PermissionDenied(f"MountSegment of {request.name!r}: only an admin identity mounts "
                                       f"shared segments; {who.name!r} may mount its own DRAM tier only")
        if method == "RegisterClient":
            prev = request.previous_client_id
            self._own(method, prev, who)
            if prev and prev not in self._owner:
                # No identity ever proved this id to this master (it restarted, or the
                # binding was forgotten): a fresh id, so no one can claim another's.
                request.previous_client_id = ""
        elif method in _CLIENT_BOUND:
            self._own(method, request.client_id, who)

    def _own(self, method: str, client_id: str, who: Identity) -> None:
        if not client_id:
            return
        owner = self._owner.get(client_id)
        if owner is not None and owner != who.name:
            raise PermissionDenied(f"{method}: client {client_id} belongs to {owner!r}, not to {who.name!r}")

    def registered(self, client_id: str, who: Identity | None, live: Iterable[str]) -> None:
        """Bind ``client_id`` (just registered) to ``who``; forget bindings of
        clients no longer in ``live`` once they outnumber the live ones."""
        if who is None:
            return
        self._owner[client_id] = who.name
        live_ids = set(live)
        if len(self._owner) > 2 * len(live_ids) + 64:
            self._owner = {c: n for c, n in self._owner.items() if c in live_ids}

    def owner(self, client_id: str) -> str | None:
        """The identity name ``client_id`` is bound to, or ``None``."""
        return self._owner.get(client_id)

    def full_stat(self, who: Identity | None) -> bool:
        """Whether Stat may show ``who`` the client table (ids, hosts, metrics URLs)."""
        return self.is_admin(who)
