"""What inference engines need of the Mooncake shim beyond the basic calls (issue #25).

The import hook beside a real Mooncake (a stand-in package on ``sys.path``),
Mooncake's newer ``setup`` arguments (tenants, SSD offload, a config dict),
``setup_dummy`` (standalone storage), ``remove_all(force=True)``, replica
descriptors, ``ReplicateConfig.group_ids``, ``bind_to_numa_node``,
``MooncakeHostMemAllocator`` and device pointers — against a real cluster (a
master and two clientds, two "hosts", on one region).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPROCESS_TIMEOUT_S = 120

# A stand-in for the real Mooncake wheel: its __init__ imports mooncake.store as the
# real one does (mooncake/buffer_pool.py), and it has engine and store modules.
_STANDIN = {
    "__init__.py": """
        from pkgutil import extend_path
        from mooncake.buffer_pool import BufferPool
        __path__ = extend_path(__path__, __name__)
        REAL = True
    """,
    "buffer_pool.py": """
        try:
            from mooncake.store import BufferPool
        except (ImportError, AttributeError):
            BufferPool = None
    """,
    "engine.py": """
        class TransferEngine:
            FROM = "stand-in mooncake.engine"
    """,
    "store.py": """
        class MooncakeDistributedStore:
            FROM = "stand-in mooncake.store"
        BufferPool = object
    """,
}


def _standin(tmp_path: Path) -> Path:
    pkg = tmp_path / "site" / "mooncake"
    pkg.mkdir(parents=True)
    for name, text in _STANDIN.items():
        (pkg / name).write_text(textwrap.dedent(text))
    return tmp_path / "site"


def _run(code: str, *, env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                       env={**os.environ, **env}, timeout=SUBPROCESS_TIMEOUT_S, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


# =============================================================== import hook
def test_hook_redirects_only_mooncake_store_beside_a_real_mooncake(tmp_path: Path) -> None:
    site = _standin(tmp_path)
    out = _run("""
        import cxlkv.compat.mooncake_alias
        import mooncake, mooncake.engine
        from mooncake.store import MooncakeDistributedStore
        from cxlkv.compat.mooncake import MooncakeDistributedStore as Cxlkv
        print(mooncake.REAL, mooncake.__file__.endswith("site/mooncake/__init__.py"))
        print(mooncake.engine.TransferEngine.FROM)
        print(MooncakeDistributedStore is Cxlkv, mooncake.store.MooncakeDistributedStore is Cxlkv)
        print(mooncake.buffer_pool.BufferPool)   # the real __init__ ran against cxlkv's store
    """, env={"PYTHONPATH": str(site), "CXLKV_AS_MOONCAKE": "1"})
    assert out.split("\n")[:4] == ["True True", "stand-in mooncake.engine", "True True", "None"]


def test_hook_replaces_a_real_store_imported_before_and_uninstall_restores_it(tmp_path: Path) -> None:
    site = _standin(tmp_path)
    out = _run("""
        import mooncake.store, mooncake.engine
        print(mooncake.store.MooncakeDistributedStore.FROM)
        from cxlkv.compat import mooncake_alias
        mooncake_alias.install()
        import mooncake.store
        from mooncake.store import MooncakeDistributedStore
        print(MooncakeDistributedStore.__module__, mooncake.engine.TransferEngine.FROM)
        mooncake_alias.uninstall()
        import mooncake.store
        print(mooncake.store.MooncakeDistributedStore.FROM)
    """, env={"PYTHONPATH": str(site), "CXLKV_AS_MOONCAKE": "0"})
    assert out.split("\n")[:3] == ["stand-in mooncake.store",
                                   "cxlkv.compat.mooncake.store stand-in mooncake.engine",
                                   "stand-in mooncake.store"]


def test_hook_without_mooncake_serves_store_only() -> None:
    out = _run("""
        import cxlkv.compat.mooncake_alias
        import mooncake, mooncake.store
        print(mooncake.store.MooncakeDistributedStore.__module__)
        for name in ("mooncake.engine", "mooncake.allocator"):
            try:
                __import__(name)
            except ModuleNotFoundError as exc:
                print("missing", exc.name)
    """, env={"CXLKV_AS_MOONCAKE": "1"})
    assert out.split("\n")[:3] == ["cxlkv.compat.mooncake.store", "missing mooncake.engine",
                                   "missing mooncake.allocator"]
