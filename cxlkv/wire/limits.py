"""Per-call limits of the daemons' APIs, so that no single call stalls a daemon.

A call's cost is proportional to its items: one request of 2M keys held a clientd
for 60 s and grew it by 800 MB. Each daemon refuses, before doing any work, a
batch call with more items than ``max_batch_items`` (config of the master and of
clientd) with :class:`~cxlkv.errors.LimitExceeded` (code ``TOO_LARGE``), and a
request larger than ``max_request_bytes`` the same way (gRPC: the server's
``max_receive_message_length``; lean frames: the frame ``length``).

The item count of a request is the length of its longest repeated field (the
packed calls carry one array per column); a repeated message field whose
messages hold repeated fields (``MatchPrefix.queries[].keys``) counts the
items inside too. The SDK splits larger batches into calls of at most
:data:`SDK_BATCH_ITEMS` items, so a user never meets the limit through it.
docs/protocol.md ("Limits") is the reference.
"""

from __future__ import annotations

from typing import Any

from cxlkv.errors import LimitExceeded

__all__ = ["DEFAULT_MAX_BATCH_ITEMS", "DEFAULT_MASTER_MAX_BATCH_ITEMS", "MIN_MAX_BATCH_ITEMS", "SDK_BATCH_ITEMS",
           "SDK_BATCH_INLINE_BYTES", "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MASTER_MAX_REQUEST_BYTES",
           "MIN_MAX_REQUEST_BYTES", "MIN_MASTER_MAX_REQUEST_BYTES", "BatchLimit"]

MiB = 1 << 20
#: Default ``max_batch_items`` of clientd, in items per call. Measured on the
#: 2-vCPU machine of docs/benchmarks.md (gRPC, empty values): a BatchPut of 16,384
#: items held clientd's loop 94 ms, one of 65,536 items 620 ms.
DEFAULT_MAX_BATCH_ITEMS = 16_384
#: Default ``max_batch_items`` of the master, in items per call: its batch puts cost
#: about 40 µs per item (measured with the one-message-per-item batch puts, since
#: removed: PutStart + PutEnd of 1,024 items 87 ms, of 4,096 250 ms; the packed
#: forms cost less); clientd sends at most 1,024 items per call.
DEFAULT_MASTER_MAX_BATCH_ITEMS = 2048
#: Most items the SDK (and clientd towards the master) puts in one call; the
#: smallest ``max_batch_items`` a configuration may set.
SDK_BATCH_ITEMS = 1024
MIN_MAX_BATCH_ITEMS = SDK_BATCH_ITEMS
#: Most inline value bytes the SDK puts in one batch call.
SDK_BATCH_INLINE_BYTES = 16 * MiB
#: Default and smallest ``max_request_bytes`` of clientd, in bytes (the SDK's
#: inline batches of 16 MiB plus their keys must fit). Parsing is proportional to
#: the items a request holds, before any limit on items can be checked: 2M keys
#: (36 MB) parse in about 55 ms, so the byte limit also bounds that time.
DEFAULT_MAX_REQUEST_BYTES = 32 * MiB
MIN_MAX_REQUEST_BYTES = 17 * MiB
#: Default and smallest ``max_request_bytes`` of the master, in bytes (clientd's
#: 1,024-item calls with 4 KiB keys take about 4.2 MiB).
DEFAULT_MASTER_MAX_REQUEST_BYTES = 16 * MiB
MIN_MASTER_MAX_REQUEST_BYTES = 8 * MiB


class BatchLimit:
    """Checks the item count of every batch method of one gRPC service.

    Args:
        service: the service descriptor (``client_pb2.DESCRIPTOR.services_by_name[...]``).
        max_items: most items accepted in one call.

    Thread-safety: immutable after construction.
    """

    def __init__(self, service: Any, max_items: int) -> None:
        self.max_items = max_items
        #: method name → (repeated fields, repeated message fields with repeated fields inside).
        self.fields: dict[str, tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...]]] = {}
        for m in service.methods:
            flat: list[str] = []
            nested: list[tuple[str, tuple[str, ...]]] = []
            for f in m.input_type.fields:
                if not f.is_repeated:
                    continue
                flat.append(f.name)
                if f.message_type is not None:
                    inner = tuple(g.name for g in f.message_type.fields if g.is_repeated)
                    if inner:
                        nested.append((f.name, inner))
            if flat:
                self.fields[m.name] = (tuple(flat), tuple(nested))

    def items(self, method: str, request: Any) -> int:
        """The number of items of ``request`` (0 for a method without repeated fields)."""
        spec = self.fields.get(method)
        if spec is None:
            return 0
        flat, nested = spec
        n = max(len(getattr(request, f)) for f in flat)
        if n > self.max_items:
            return n
        for name, inner in nested:
            total = 0
            for msg in getattr(request, name):
                total += max(len(getattr(msg, g)) for g in inner)
            n = max(n, total)
        return n

    def check(self, method: str, request: Any) -> None:
        """Refuse ``request`` when it holds more than ``max_items`` items.

        Raises:
            LimitExceeded: too many items (code ``TOO_LARGE``).
        """
        if method not in self.fields or request.ByteSize() <= self.max_items:
            # Every item of a repeated field takes at least one byte on the wire (a
            # packed number one or more, a string or message a tag and a length), so
            # a request of at most ``max_items`` bytes holds at most that many items:
            # the common small call is let through without counting its columns.
            return
        n = self.items(method, request)
        if n > self.max_items:
            raise LimitExceeded(
                f"{method}: {n} items in one call is over the limit of {self.max_items} "
                f"(max_batch_items); split the batch into calls of at most {self.max_items} items",
                limit_name="max_batch_items", limit=self.max_items, requested=n)
