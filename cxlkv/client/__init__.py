"""The cxlkv SDK: :class:`Client` talks to the clientd of this host.

::

    from cxlkv import Client

    with Client() as c:                      # $CXLKV_SOCKET or the default socket
        c.put("block-0", b"...")
        assert c.get("block-0") == b"..."
        buf = c.buffer(16 << 20)             # shared memory: zero-copy puts and gets
        n = c.get_into("block-0", buf)

See docs/sdk.md. :mod:`cxlkv.client.framing` is the lean wire format shared
with the daemon.
"""

from __future__ import annotations

from cxlkv.client._client import DEFAULT_POOL_BYTES, Client, KeyInfo, Result, default_socket_path

__all__ = ["Client", "Result", "KeyInfo", "DEFAULT_POOL_BYTES", "default_socket_path"]
