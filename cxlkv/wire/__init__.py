"""How cxlkv's parts talk: the rules every key and put option follows
(:mod:`~cxlkv.wire.keys`), lean frames (:mod:`~cxlkv.wire.lean`), request parsing that
never fails a server (:mod:`~cxlkv.wire.parse`), gRPC reflection
(:mod:`~cxlkv.wire.reflection`), per-call limits (:mod:`~cxlkv.wire.limits`), mutual
TLS and identities (:mod:`~cxlkv.wire.tls`), and messages as plain dicts
(:mod:`~cxlkv.wire.protodict`). The messages themselves are :mod:`cxlkv.v1`; the SDK's
side of the lean framing is :mod:`cxlkv.client.framing`."""
