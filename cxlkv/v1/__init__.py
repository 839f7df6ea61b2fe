"""cxlkv's protocol: messages and gRPC stubs generated from proto/ by ``make proto``.

The stubs are generated for the oldest runtime the SDK supports (protobuf
5.29.0, grpcio 1.70.0) so that the SDK installs beside inference engines that pin
those packages; protobuf's gencode check accepts any runtime at least as new as
the gencode, and grpc's stubs any grpcio at least as new as grpcio-tools.

protobuf 6.x warns, once per file, that 5.x gencode is "exactly one major
version older" than the runtime (protobuf 7 no longer checks the major version).
The gencode is old on purpose; that warning is silenced for cxlkv's own files.
"""

import warnings

warnings.filterwarnings(
    "ignore",
    message=r"Protobuf gencode version \S+ is exactly one major version older than the runtime version \S+ "
            r"at cxlkv/v1/",
    category=UserWarning,
)
