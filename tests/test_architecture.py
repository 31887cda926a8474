"""The package's floors: imports go down only, no circles, no module tricks.

    app → lab → run → fast → book → tasks → kernel (config → yamlfile, catalog → errors)

Every `import` is read from the source with `ast`, lazy ones inside functions and
`TYPE_CHECKING` blocks included, so a deferred import cannot hide an arrow that points up.
A module may import its own floor and the floors below it. `minitfm/__init__.py` (the
package's front door, which lazily re-exports the Python API) counts as the top floor, and
anyone may read `minitfm.__version__` from it: Python runs the package's `__init__` before any
of its modules anyway, so that arrow adds no dependency. The kernel is the package's top-level
modules, each a floor of its own: torch-free, each importing only the kernel below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "minitfm"
KERNEL = ["errors", "catalog", "yamlfile", "config"]  # bottom to top; no torch
FLOORS = [*KERNEL, "tasks", "book", "fast", "run", "lab", "app"]  # bottom to top
TOP = {"minitfm", "minitfm.__main__"}  # the front door sits above every floor


def module_name(path: Path) -> str:
    """minitfm/book/model.py -> minitfm.book.model (a package's __init__ -> the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The minitfm modules `name` imports anywhere in its source (`from minitfm.x import y`
    counts as minitfm.x.y when that is a module, else as minitfm.x)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return {m for m in found if m == "minitfm" or m.startswith("minitfm.")}


def floor(name: str) -> int:
    """The floor of a module: its index in FLOORS (the front door is above them all)."""
    if name in TOP:
        return len(FLOORS)
    return FLOORS.index(name.split(".")[1])


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_sits_on_a_floor():
    assert all(name in TOP or name.split(".")[1] in FLOORS for name in MODULES), sorted(MODULES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_go_down_only(name):
    upward = sorted(m for m in GRAPH[name] - {"minitfm"} if floor(m) > floor(name))
    assert not upward, f"{name} (floor {FLOORS[floor(name)] if name not in TOP else 'top'}) " \
                       f"imports from a floor above it: {upward}"


def test_the_kernel_imports_only_the_kernel_below_it_and_no_torch():
    # A config reads the same without torch and on any machine.
    for i, name in enumerate(KERNEL):
        module = f"minitfm.{name}"
        assert GRAPH[module] <= {f"minitfm.{below}" for below in KERNEL[:i]}, GRAPH[module]
        tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
        found = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
        found |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not [m for m in found if m and m.split(".")[0] == "torch"], module


def test_the_kernels_know_no_model():
    """The appendix's kernels and packing import only torch; only fast/model.py reads the book."""
    for name in ("minitfm.fast.kernels", "minitfm.fast.packing"):
        assert GRAPH[name] == set(), (name, GRAPH[name])


def test_the_book_imports_nothing_of_the_appendix():
    for name in (m for m in MODULES if m.startswith("minitfm.book")):
        assert not any(m.startswith("minitfm.fast") for m in GRAPH[name]), (name, GRAPH[name])


def test_no_import_circles():
    """No module reaches itself by following imports (lazy ones included)."""
    state: dict[str, str] = {}  # name -> "open" while on the path, "done" after

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(GRAPH.get(name, ())):
            if dep == name or dep not in GRAPH:
                continue
            if state.get(dep) == "open":
                circle = path[path.index(dep):] + [dep]
                pytest.fail("import circle: " + " -> ".join(circle))
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = "done"

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


def test_the_checker_sees_lazy_imports():
    """The reader above finds imports inside functions (where most of the CLI's are)."""
    assert "minitfm.run.session" in GRAPH["minitfm.app.cli"] | GRAPH["minitfm.app.api"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_swaps_its_class_or_sys_modules(name):
    """`sys.modules[__name__].__class__ = ...` made a module callable once; never again."""
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            text = ast.unparse(target)
            assert "__class__" not in text and "sys.modules" not in text, f"{name}: {text}"


def test_the_books_tests_read_only_the_book_and_what_is_below_it():
    """`make test-book` checks the chapters alone: its tests import nothing above the book."""
    above = ("minitfm.fast", "minitfm.run", "minitfm.lab", "minitfm.app")
    for path in sorted((PACKAGE.parent / "tests" / "book").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(above), f"{path.name}: {node.module}"
            if isinstance(node, ast.ImportFrom) and node.module == "tests.helpers":
                pytest.fail(f"{path.name} imports tests.helpers (the CLI's): use tests.book")
