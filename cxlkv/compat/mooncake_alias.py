"""Serve ``import mooncake.store`` from cxlkv, so engines need no code change.

:func:`install` puts an import hook in front of ``sys.meta_path``: afterwards
``from mooncake.store import MooncakeDistributedStore, ReplicateConfig`` (as
SGLang, vLLM and LMCache write it) yields the classes of
:mod:`cxlkv.compat.mooncake`, even where the real Mooncake is installed. Only
``mooncake.store`` is redirected: ``mooncake.engine`` (the TransferEngine of
prefill/decode disaggregation) and every other ``mooncake.*`` module still come
from the real Mooncake in the same process.

Importing this module installs the hook when ``CXLKV_AS_MOONCAKE=1`` is set, so
a one-line ``.pth`` file in site-packages (``import cxlkv.compat.mooncake_alias``)
switches a whole environment by that variable alone (docs/compat-mooncake.md).
The module itself imports nothing heavy: cxlkv's client loads on first use of
``mooncake.store``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

__all__ = ["ENV_VAR", "install", "uninstall", "installed"]

#: Set to ``1`` to install the hook when this module is imported.
ENV_VAR = "CXLKV_AS_MOONCAKE"
_IMPL = "cxlkv.compat.mooncake"


class _Loader(importlib.abc.Loader):
    """Builds ``mooncake.store`` from cxlkv's names, and an empty ``mooncake`` package
    when the real Mooncake is not installed."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "mooncake":
            module.__doc__ = ("Mooncake's package name; Mooncake is not installed, so only mooncake.store "
                              "exists, served by cxlkv (cxlkv.compat.mooncake_alias).")
            return
        impl = importlib.import_module(_IMPL)
        module.__doc__ = impl.__doc__
        for name in impl.__all__:
            setattr(module, name, getattr(impl, name))
        module.__all__ = list(impl.__all__)  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    """Answers for ``mooncake.store`` always, and for ``mooncake`` only where no
    other finder can: every other ``mooncake.*`` module is the real Mooncake's."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "mooncake.store":
            return importlib.machinery.ModuleSpec(fullname, _Loader())
        if fullname == "mooncake":
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return None  # the real Mooncake: let the import system load it
            spec = importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
            spec.submodule_search_locations = []  # mooncake.engine etc.: ModuleNotFoundError
            return spec
        return None


_FINDER = _Finder()
_SERVED = ("mooncake.store",)


def installed() -> bool:
    """Whether the hook is installed."""
    return _FINDER in sys.meta_path


def _ours(mod: types.ModuleType | None) -> bool:
    return mod is not None and isinstance(getattr(mod, "__loader__", None), _Loader)


def install() -> None:
    """Make ``import mooncake.store`` load cxlkv's compatibility layer.

    Only ``mooncake.store`` is served by cxlkv. ``mooncake`` itself and every
    other ``mooncake.*`` module (``mooncake.engine``'s TransferEngine,
    ``mooncake.allocator``, …) come from the real Mooncake when it is installed;
    without it, ``mooncake`` is an empty package holding only ``store``.

    Idempotent. A real ``mooncake.store`` imported before the hook was installed
    is dropped from ``sys.modules`` so the next import goes through the hook
    (objects already created from it keep working on their own).
    """
    if not installed():
        sys.meta_path.insert(0, _FINDER)
    mod = sys.modules.get("mooncake.store")
    if mod is not None and not _ours(mod):
        del sys.modules["mooncake.store"]
        parent = sys.modules.get("mooncake")
        if parent is not None and getattr(parent, "store", None) is mod:
            delattr(parent, "store")


def uninstall() -> None:
    """Remove the hook and forget the modules it served."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in ("mooncake.store", "mooncake"):
        mod = sys.modules.get(name)
        if _ours(mod):
            del sys.modules[name]
            parent = sys.modules.get("mooncake")
            if name == "mooncake.store" and parent is not None and getattr(parent, "store", None) is mod:
                delattr(parent, "store")


if os.environ.get(ENV_VAR, "") == "1":
    install()
