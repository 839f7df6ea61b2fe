"""The on-region formats: what a region holds and how every host reads it.

* :mod:`cxlkv.layout.region` -- the region's identity header and its extents' bounds;
* :mod:`cxlkv.layout.index` -- the committed-object index (slots, grants; docs/index.md);
* :mod:`cxlkv.layout.objheader` -- the header that makes every extent self-describing.

Byte layouts are versioned formats documented in docs/ (a reader in another
language can be written from the pages alone); the C transport's constants are
checked against these modules' at import (``cxlkv.transport``).
"""
