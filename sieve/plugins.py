"""Plugins: packages outside the serving core (sieve.research, or a user's own) that register stages and
cross-encoder heads when imported, or when their `register_plugin()` is called right after (a plugin that wants its
package light to import, as sieve.research does for the command line). Each is named in the `sieve.plugins` entry-point group of its distribution's
metadata (pyproject.toml), so the core finds them without importing them by name. Imports nothing of Sieve's."""
from __future__ import annotations

import logging
from importlib.metadata import entry_points

log = logging.getLogger("sieve.plugins")
ENTRY_POINT_GROUP = "sieve.plugins"
_loaded: list[str] | None = None


def load_plugins() -> list[str]:
    """Import every module of the group, once; a plugin that fails to import is logged and left out, so the core
    keeps serving. Returns the names of those that loaded."""
    global _loaded
    if _loaded is not None:
        return list(_loaded)
    _loaded = []
    for point in entry_points(group=ENTRY_POINT_GROUP):
        try:
            module = point.load()
            getattr(module, "register_plugin", lambda: None)()
            _loaded.append(point.name)
        except Exception as exc:  # noqa: BLE001 (a broken plugin must not take the core down)
            log.error("plugin %s (%s) failed to load: %s", point.name, point.value, exc)
    return list(_loaded)
