"""Plugin registry: allocation strategies and eviction policies from entry points.

Built-ins register exactly like third-party plugins (``pyproject.toml``
``[project.entry-points."cxlkv.allocation_strategies"]``), so there is one code
path. Loading is strict: an unknown name fails with the known names listed, and a
plugin that fails to import or is not the right kind of object is an error —
never silently skipped or replaced by a fallback.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from cxlkv.errors import ConfigError

__all__ = ["STRATEGY_GROUP", "POLICY_GROUP", "available", "load_plugin"]

#: Entry-point group of allocation strategies.
STRATEGY_GROUP = "cxlkv.allocation_strategies"
#: Entry-point group of eviction policies.
POLICY_GROUP = "cxlkv.eviction_policies"


def _entry_points(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def available(group: str) -> list[str]:
    """Sorted names registered in entry-point ``group``."""
    return sorted(_entry_points(group))


def load_plugin(group: str, name: str, base: type) -> type:
    """Load the class registered as ``name`` in ``group``.

    Args:
        group: :data:`STRATEGY_GROUP` or :data:`POLICY_GROUP`.
        name: the entry point's name (the config value).
        base: the class the plugin must subclass.

    Returns:
        The plugin class (not an instance).

    Raises:
        ConfigError: ``name`` is not registered (the message lists the known
            names), the plugin fails to import (the message carries the cause),
            or it is not a subclass of ``base``.
    """
    eps = _entry_points(group)
    ep = eps.get(name)
    if ep is None:
        known = ", ".join(sorted(eps)) or "(none)"
        raise ConfigError(f"unknown {group} plugin {name!r}; known: {known}")
    try:
        obj = ep.load()
    except Exception as exc:  # an import error of a plugin is a loud config error
        raise ConfigError(
            f"{group} plugin {name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise ConfigError(
            f"{group} plugin {name!r} ({ep.value}) is not a subclass of {base.__module__}.{base.__qualname__}"
        )
    return obj
