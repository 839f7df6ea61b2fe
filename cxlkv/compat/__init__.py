"""Compatibility layers: other stores' client APIs served by cxlkv.

* :mod:`cxlkv.compat.mooncake` — Mooncake Store's Python API
  (``MooncakeDistributedStore``), so inference engines written for Mooncake
  (SGLang's hierarchical cache, vLLM's and LMCache's Mooncake connectors) run on
  cxlkv with one import line changed. See docs/compat-mooncake.md.
"""
