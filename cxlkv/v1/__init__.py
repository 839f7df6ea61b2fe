"""cxlkv's protocol: messages and gRPC stubs generated from proto/ by ``make proto``.

The stubs are generated for the oldest runtime the SDK supports (protobuf
5.29.0, grpcio 1.70.0) so that the SDK installs beside inference engines that pin
those packages; protobuf's gencode check accepts any runtime at least as new as
the gencode, and grpc's stubs any grpcio at least as new as grpcio-tools.

protobuf 6.x warns, once per file, that 5.x gencode is "exactly one major
version older" than the runtime (protobuf 7 no longer checks the major version).
The gencode is old on purpose; that warning is silenced for cxlkv's own files.

An installed wheel also carries the ``.proto`` files here (``cxlkv/v1/*.proto``),
so :func:`proto_include_dir` is an include root for ``protoc`` in any language::

    protoc -I "$(python -c 'import cxlkv.v1; print(cxlkv.v1.proto_include_dir())')" \\
        --go_out=. cxlkv/v1/client.proto
"""

from __future__ import annotations

import warnings
from pathlib import Path

warnings.filterwarnings(
    "ignore",
    message=r"Protobuf gencode version \S+ is exactly one major version older than the runtime version \S+ "
            r"at cxlkv/v1/",
    category=UserWarning,
)

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
