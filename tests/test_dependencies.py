"""Every third-party package `sieve` imports at module level is installed by `pip install .` alone: declared in
pyproject's `dependencies` or required by one that is (README's serve command installs no extras; a module-level
import of a test-only package once made `sieve demo` fail on a fresh machine)."""
from __future__ import annotations

import ast
import sys
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]


def module_level_imports() -> dict[str, set[str]]:
    """Top-level package -> files importing it in their module body (imports inside functions are lazy: optional)."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "sieve").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("sieve", "__future__"):
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def declared_dependencies() -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the installed metadata (pyproject as of the last install)
        return [spec for spec in requires("sieve") or [] if "extra ==" not in spec]
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def installed_by_plain_install() -> set[str]:
    """Declared dependencies and, transitively, what they require (markers evaluated, no extras)."""
    todo = [Requirement(spec) for spec in declared_dependencies()]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(spec) for spec in requires(req.name) or []]
        except PackageNotFoundError:
            pass
    return seen


def test_every_module_level_import_is_a_runtime_dependency():
    distributions = packages_distributions()
    runtime = installed_by_plain_install()
    missing = {top: sorted(files) for top, files in module_level_imports().items()
               if not {canonicalize_name(d) for d in distributions.get(top, [top])} & runtime}
    assert not missing, f"imported at module level but not installed by `pip install .`: {missing}"


def test_the_check_sees_a_missing_dependency():
    assert "httpx" in module_level_imports()  # sieve/pipeline/remote_ce.py
    assert "pytest" not in installed_by_plain_install()
