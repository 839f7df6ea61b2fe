"""Generated protobuf and gRPC modules of ``proto/cxlkv/v1/*.proto`` (``make proto``).

An installed wheel also carries the ``.proto`` files here (``cxlkv/v1/*.proto``),
so :func:`proto_include_dir` is an include root for ``protoc`` in any language::

    protoc -I "$(python -c 'import cxlkv.v1; print(cxlkv.v1.proto_include_dir())')" \\
        --go_out=. cxlkv/v1/client.proto
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["proto_include_dir"]


def proto_include_dir() -> Path:
    """The directory holding ``cxlkv/v1/*.proto``: the installed package's root for
    a wheel, the checkout's ``proto/`` for a source (editable) install.

    Raises:
        FileNotFoundError: neither has the files (a broken install).
    """
    here = Path(__file__).resolve().parent
    for root in (here.parent.parent, here.parent.parent / "proto"):
        if (root / "cxlkv" / "v1" / "client.proto").is_file():
            return root
    raise FileNotFoundError(f"no cxlkv/v1/*.proto beside {here} or in the checkout's proto/")
