"""Mooncake tenants on cxlkv: isolated key namespaces, as ``setup(tenant_id=...)`` asks.

Mooncake keeps the objects of each tenant apart: a key written by tenant ``a``
is invisible to tenant ``b``, and ``remove_all`` of one tenant leaves the others'.
cxlkv has one key space, so the shim gives every tenant but ``"default"`` a key
prefix that no other tenant can produce::

    "\\x1e" + tenant_id + "\\x1e" + key       (U+001E, the ASCII record separator)

* A ``tenant_id`` may not contain U+001E, so no tenant's prefix begins another's.
* The ``"default"`` tenant keeps keys as they are (its objects are the ones every
  cxlkv client sees), and its keys may not begin with U+001E: such a key answers
  ``INVALID_KEY`` (-400), so the default tenant cannot reach into a tenant's space.
* The prefix counts against cxlkv's 4096-byte key limit (``len(tenant_id) + 2``
  UTF-8 bytes fewer for the tenant's own keys).

:class:`TenantClient` wraps a :class:`cxlkv.Client` with that mapping for the
calls the shim makes; the store is written against it unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, List

from cxlkv.client import Client, KeyInfo
from cxlkv.errors import InvalidArgument

__all__ = ["DEFAULT_TENANT", "SEPARATOR", "TenantClient", "tenant_prefix"]

#: Mooncake's default tenant (its ``setup`` default): keys are kept as they are.
DEFAULT_TENANT = "default"
#: Begins and ends a tenant's key prefix; reserved: no default-tenant key starts with it.
SEPARATOR = "\x1e"
#: Stands in for a default-tenant key that begins with :data:`SEPARATOR`: the SDK
#: refuses it as an invalid key (NUL is never allowed), so every call answers by its
#: own convention for an invalid key (``INVALID_KEY``, ``b""``, -1, …).
_REFUSED_KEY = "\x00reserved"
#: Keys listed per page when a tenant's keys are scanned (``remove_by_regex``).
_PAGE_KEYS = 1000


def _re2_literal(text: str) -> str:
    """``text`` as an RE2 pattern matching it literally (RE2's metacharacters escaped)."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", text)


def tenant_prefix(tenant_id: str) -> str:
    """The key prefix of ``tenant_id`` (``""`` for the default tenant).

    Raises:
        InvalidArgument: not a non-empty str, or it contains NUL or U+001E.
    """
    if not isinstance(tenant_id, str) or not tenant_id:
        raise InvalidArgument(f"tenant_id must be a non-empty str, got {tenant_id!r}")
    if SEPARATOR in tenant_id or "\x00" in tenant_id:
        raise InvalidArgument("tenant_id may not contain NUL or U+001E")
    return "" if tenant_id == DEFAULT_TENANT else f"{SEPARATOR}{tenant_id}{SEPARATOR}"


class TenantClient:
    """A :class:`cxlkv.Client` seen through one tenant's key namespace.

    Every key argument is mapped into the namespace and every key returned is
    mapped back; values, sizes and errors pass unchanged. ``remove_all`` removes
    only this tenant's objects.

    Args:
        client: the connected client (closed by :meth:`close`).
        tenant_id: the tenant (``"default"``: keys unchanged, but none may begin
            with U+001E).

    Raises:
        InvalidArgument: a bad ``tenant_id`` (see :func:`tenant_prefix`).
    """

    def __init__(self, client: Client, tenant_id: str = DEFAULT_TENANT) -> None:
        self.client = client
        self.tenant_id = tenant_id
        self.prefix = tenant_prefix(tenant_id)

    # ----------------------------------------------------------------- keys
    def key(self, key: Any) -> Any:
        """The cxlkv key of a tenant's ``key`` (non-str keys pass, for the SDK to refuse)."""
        if not isinstance(key, str):
            return key
        if self.prefix:
            return self.prefix + key
        return _REFUSED_KEY if key.startswith(SEPARATOR) else key

    def keys(self, keys: Iterable[Any]) -> list[Any]:
        """:meth:`key` of each key."""
        return [self.key(k) for k in keys]

    def own(self, cxlkv_key: str) -> str | None:
        """The tenant's key for a cxlkv key, or ``None`` when it is another tenant's."""
        if self.prefix:
            return cxlkv_key[len(self.prefix):] if cxlkv_key.startswith(self.prefix) else None
        return None if cxlkv_key.startswith(SEPARATOR) else cxlkv_key

    # ------------------------------------------------------- the SDK's calls
    def put(self, key: str, value: Any, **kw: Any) -> Any:
        return self.client.put(self.key(key), value, **kw)

    def put_from(self, key: str, src: Any, **kw: Any) -> Any:
        return self.client.put_from(self.key(key), src, **kw)

    def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]], **kw: Any) -> Any:
        pairs = items.items() if isinstance(items, Mapping) else items
        return self.client.put_many([(self.key(k), v) for k, v in pairs], **kw)

    def put_from_many(self, keys: Sequence[str], srcs: Sequence[Any], **kw: Any) -> Any:
        return self.client.put_from_many(self.keys(keys), srcs, **kw)

    def get(self, key: str) -> bytes:
        return self.client.get(self.key(key))

    def get_into(self, key: str, dst: Any) -> int:
        return self.client.get_into(self.key(key), dst)

    def get_many(self, keys: Sequence[str]) -> Any:
        return self.client.get_many(self.keys(keys))

    def get_into_many(self, keys: Sequence[str], dsts: Sequence[Any]) -> Any:
        return self.client.get_into_many(self.keys(keys), dsts)

    def exists(self, key: str) -> bool:
        return self.client.exists(self.key(key))

    def exists_many(self, keys: Sequence[str]) -> Any:
        return self.client.exists_many(self.keys(keys))

    def remove(self, key: str, force: bool = False) -> None:
        self.client.remove(self.key(key), force=force)

    def remove_many(self, keys: Sequence[str], force: bool = False) -> Any:
        return self.client.remove_many(self.keys(keys), force=force)

    def list(self, prefix: str = "", *, page_size: int = 1000) -> Iterator[KeyInfo]:
        """The tenant's keys starting with ``prefix`` (keys shown without the tenant prefix)."""
        for info in self.client.list(self.key(prefix) if prefix else self.prefix, page_size=page_size):
            own = self.own(info.key)
            if own is not None:
                yield KeyInfo(own, info.size_bytes, info.version, info.replica_count)

    def remove_all(self, force: bool = False, regex: str = "") -> int:
        """Remove this tenant's objects (those whose key, without the prefix, matches ``regex``).

        Returns:
            Objects removed (leased ones skipped unless ``force``).

        Raises:
            InvalidArgument: ``regex`` does not compile with RE2.
        """
        if self.prefix and not regex:
            return self.client.remove_all(force=force, regex="^" + _re2_literal(self.prefix))
        if not self.prefix:
            if not self._tenants_exist():
                return self.client.remove_all(force=force, regex=regex)  # nothing else to keep apart
            if not regex:
                return self.client.remove_all(force=force, regex=f"^[^{SEPARATOR}]")  # all but tenants'
        from cxlkv.wire.keys import compile_key_pattern

        pattern = compile_key_pattern(regex) if regex else None
        removed = 0
        batch: List[str] = []
        for info in list(self.list(page_size=_PAGE_KEYS)):
            if pattern is None or pattern.search(info.key):
                batch.append(info.key)
            if len(batch) >= _PAGE_KEYS:
                removed += self._remove_batch(batch, force)
                batch = []
        if batch:
            removed += self._remove_batch(batch, force)
        return removed

    def _remove_batch(self, keys: List[str], force: bool) -> int:
        return sum(1 for r in self.remove_many(keys, force=force) if r.ok)

    def _tenants_exist(self) -> bool:
        it = self.client.list(SEPARATOR, page_size=1)
        try:
            return next(it, None) is not None
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def buffer(self, size_bytes: int) -> Any:
        return self.client.buffer(size_bytes)

    def close(self) -> None:
        self.client.close()

    def __getattr__(self, name: str) -> Any:  # everything key-free (stat, …) is the client's own
        return getattr(self.client, name)

    def __repr__(self) -> str:
        return f"<TenantClient {self.tenant_id!r} of {self.client!r}>"
