"""cxlkv — a distributed KV-cache store for LLM inference on shared CXL memory.

Inference processes import :class:`cxlkv.Client` (the SDK) and talk to the
clientd on their host. See README.md and docs/.
"""

from __future__ import annotations

from cxlkv._version import __version__

__all__ = ["__version__", "Client"]


def __getattr__(name: str):  # lazy: importing cxlkv stays cheap for the CLI
    if name == "Client":
        from cxlkv.client import Client

        return Client
    raise AttributeError(f"module 'cxlkv' has no attribute {name!r}")
