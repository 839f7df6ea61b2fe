"""Serve ``import mooncake.store`` from cxlkv, so engines need no code change.

:func:`install` puts an import hook in front of ``sys.meta_path``: afterwards
``from mooncake.store import MooncakeDistributedStore, ReplicateConfig`` (as
SGLang, vLLM and LMCache write it) yields the classes of
:mod:`cxlkv.compat.mooncake`, even where the real Mooncake is installed.

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

__all__ = ["ENV_VAR", "install", "uninstall", "installed"]

#: Set to ``1`` to install the hook when this module is imported.
ENV_VAR = "CXLKV_AS_MOONCAKE"
_IMPL = "cxlkv.compat.mooncake"


class _Loader(importlib.abc.Loader):
    """Builds ``mooncake`` (an empty package) and ``mooncake.store`` (cxlkv's names)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "mooncake":
            module.__doc__ = "Mooncake's Python package name, served by cxlkv (cxlkv.compat.mooncake_alias)."
            return
        impl = importlib.import_module(_IMPL)
        module.__doc__ = impl.__doc__
        for name in impl.__all__:
            setattr(module, name, getattr(impl, name))
        module.__all__ = list(impl.__all__)  # type: ignore[attr-defined]


class _Finder(importlib.abc.MetaPathFinder):
    """Answers for ``mooncake`` and ``mooncake.store`` only."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "mooncake":
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        if fullname == "mooncake.store":
            return importlib.machinery.ModuleSpec(fullname, _Loader())
        return None


_FINDER = _Finder()


def installed() -> bool:
    """Whether the hook is installed."""
    return _FINDER in sys.meta_path


def install() -> None:
    """Make ``import mooncake`` / ``mooncake.store`` load cxlkv's compatibility layer.

    Idempotent. A ``mooncake`` package imported before the hook was installed is
    dropped from ``sys.modules`` so the next import goes through the hook (objects
    already created from it keep working on their own).
    """
    if not installed():
        sys.meta_path.insert(0, _FINDER)
    for name in ("mooncake.store", "mooncake"):
        mod = sys.modules.get(name)
        if mod is not None and not isinstance(getattr(mod, "__loader__", None), _Loader):
            del sys.modules[name]


def uninstall() -> None:
    """Remove the hook and forget the modules it served."""
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in ("mooncake.store", "mooncake"):
        mod = sys.modules.get(name)
        if mod is not None and isinstance(getattr(mod, "__loader__", None), _Loader):
            del sys.modules[name]


if os.environ.get(ENV_VAR, "") == "1":
    install()
