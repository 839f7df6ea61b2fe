"""The client daemon (``cxlkv clientd``): one per host.

It maps the shared CXL region(s), registers with the master, and serves the
inference processes of its host through a gRPC API and a lean framing on Unix
sockets, doing every copy between application memory and the region.

Modules: :mod:`.core` (put/read protocols), :mod:`.master_link` (registration,
heartbeats, coalesced master calls), :mod:`.batcher` (group commit),
:mod:`.buffers` (shared buffers), :mod:`.regions` (mapping and identity),
:mod:`.api` (ClientService over messages), :mod:`.grpc_service` and :mod:`.lean`
(front-ends), :mod:`.daemon` (the process), :mod:`.cli`.
"""
