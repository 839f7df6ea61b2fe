"""cffi build script for ``cxlkv.transport._transport`` (API mode, out of line).

Run by setuptools through ``cffi_modules`` in setup.py at install time. The C
declarations come from ``cxlkv_transport.h`` (the public header every C file
under ``c/`` includes through ``c/internal.h``), minus preprocessor lines other than integer ``#define`` constants,
which cffi's cdef does not parse.
"""

from __future__ import annotations

import os
import platform
import re

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "cxlkv_transport.h")
# The C files, one per concern (c/internal.h lists them); sorted: a stable build.
CDIR = os.path.join(HERE, "c")
SOURCES = sorted(os.path.join(CDIR, name) for name in os.listdir(CDIR) if name.endswith(".c"))
INTERNAL_HEADER = os.path.join(CDIR, "internal.h")
XXHASH = os.path.join(HERE, "third_party", "xxhash")  # vendored xxHash 0.8.4, see its README.md


def _xxhash_sources() -> list[str]:
    """xxHash's own sources, built as python-xxhash builds them: xxhash.c, plus
    the run-time AVX2/AVX-512 dispatcher on x86-64."""
    sources = [os.path.join(XXHASH, "xxhash.c")]
    if platform.machine() in ("x86_64", "AMD64"):
        sources.append(os.path.join(XXHASH, "xxh_x86dispatch.c"))
    return sources

_INT_DEFINE = re.compile(r"^\s*#\s*define\s+[A-Z_][A-Z0-9_]*\s+-?\d+\s*$")


def cdef_text(header_text: str) -> str:
    """The header as cffi's cdef accepts it: preprocessor lines removed except
    integer ``#define NAME 123`` constants (the include guard's bare
    ``#define`` goes too)."""
    lines = []
    for line in header_text.splitlines():
        if line.lstrip().startswith("#") and not _INT_DEFINE.match(line):
            continue
        lines.append(line)
    return "\n".join(lines)


def _compile_args() -> list[str]:
    # No -march: the binary must run on any CPU of its architecture; CLWB and
    # CLFLUSHOPT code paths carry per-function target attributes instead.
    args = ["-O3", "-std=gnu11", "-Wall", "-Wno-unused-function"]
    if platform.system() != "Linux":
        raise RuntimeError("cxlkv.transport needs Linux (mmap of DAX devices, madvise)")
    return args


ffibuilder = FFI()
with open(HEADER, encoding="utf-8") as f:
    ffibuilder.cdef(cdef_text(f.read()))

# The C files are their own compilation units (not pasted after Python.h), so
# their feature macros and includes are their own.
ffibuilder.set_source(
    "cxlkv.transport._transport",
    '#include "cxlkv_transport.h"',
    sources=[os.path.relpath(p) for p in SOURCES + _xxhash_sources()],
    include_dirs=[HERE, XXHASH],
    # Own namespace: no clash with python-xxhash's copy of the same symbols.
    define_macros=[("XXH_NAMESPACE", "cxlkv_")],
    extra_compile_args=_compile_args(),
    depends=[HEADER, INTERNAL_HEADER, *SOURCES, os.path.join(XXHASH, "xxhash.h")],
)

if __name__ == "__main__":  # python transport/build_transport.py: build in place
    ffibuilder.compile(tmpdir=os.path.join(HERE, "..", "build"), verbose=True)
