"""What a Python source imports, read with `ast`: the import checkers' one reader.

Imports inside functions count, and a relative one counts as the absolute name it stands for
(`from ..app import cli` in minitfm/book/model.py is minitfm.app), so that no spelling hides an
arrow. ruff bans relative imports in the package too (TID252); this reader does not rely on it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_of(path: Path) -> str:
    """Where a file's relative imports start: minitfm/book/model.py -> minitfm.book (a
    package's __init__.py: the package itself)."""
    return ".".join(path.resolve().relative_to(ROOT).parts[:-1])


def read_imports(source: str, package: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in `source`, a module of `package`: `import a.b` gives
    ("a.b", []), `from .x import y` ("<package>.x", ["y"])."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = importlib.util.resolve_name("." * node.level + module, package)
            found.append((module, [alias.name for alias in node.names]))
    return found


def file_imports(path: Path) -> list[tuple[str, list[str]]]:
    """`read_imports` of a file of this repository."""
    return read_imports(path.read_text(encoding="utf-8"), package_of(path))


def imported_modules(path: Path) -> set[str]:
    """The modules a file imports from (not the names it takes from them)."""
    return {module for module, _ in file_imports(path)}
