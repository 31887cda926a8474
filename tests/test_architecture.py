"""The package's floors: imports go down only, no circles, no module tricks.

    app → lab → run → learn → fast → book → tasks → kernel (config → overrides → schema →
    yamlfile, catalog → errors → version)

Every `import` is read from the source with `ast`, lazy ones inside functions and
`TYPE_CHECKING` blocks included, and relative ones resolved (tests/imports.py), so neither a
deferred import nor a spelling can hide an arrow that points up.
A module may import its own floor and the floors below it. `minitfm/__init__.py` (the
package's front door, which lazily re-exports the Python API) counts as the top floor, and no
module below it imports it: the version a command prints or a page records is read from the
kernel's `version`, below every floor. The kernel is the package's top-level modules, each a
floor of its own: torch-free, each importing only the kernel below it.

The lab has wings by the question each answers, on floors inside its floor: the modules it
shares (`lab/*.py`: the loaded run, the options, the curves, the pictures) at the bottom, then
`measure`, `attention`, `interpret` and `watch` side by side, `explore`, `many`. A lab module
may import its own wing and the floors below it, never a wing beside it or above; nothing
shared uses a wing. And no room grows too big: no module over 500 lines (a lab module over 450),
no module docstring over 30 lines, no public function with more than 6 parameters but the Typer
commands, whose parameters are the options. Every package's docstring names all its rooms.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from tests.imports import file_imports, read_imports

PACKAGE = Path(__file__).resolve().parent.parent / "minitfm"
# the kernel, bottom up: no torch
KERNEL = ["version", "errors", "catalog", "yamlfile", "schema", "overrides", "config"]
FLOORS = [*KERNEL, "tasks", "book", "fast", "learn", "run", "lab", "app"]  # bottom to top
TOP = {"minitfm", "minitfm.__main__"}  # the front door sits above every floor
# the lab's wings, a floor each, bottom to top, above its shared modules; wings on one floor
# side by side, neither importing the other
WINGS = [("measure",), ("attention",), ("interpret", "watch"), ("explore",), ("many",)]
MAX_LINES, MAX_LAB_LINES, MAX_PARAMETERS, MAX_DOCSTRING_LINES = 500, 450, 6, 30


def module_name(path: Path) -> str:
    """minitfm/book/model.py -> minitfm.book.model (a package's __init__ -> the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str) -> set[str]:
    """The minitfm modules `name` imports anywhere in its source (`from minitfm.x import y`
    counts as minitfm.x.y when that is a module, else as minitfm.x; relative imports resolved)."""
    found = set()
    for module, names in file_imports(MODULES[name]):
        found |= {f"{module}.{alias}" if f"{module}.{alias}" in MODULES else module
                  for alias in names} if names else {module}
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
    # the front door ("minitfm") is above every floor: no module below it imports it
    upward = sorted(m for m in GRAPH[name] if floor(m) > floor(name))
    assert not upward, f"{name} (floor {FLOORS[floor(name)] if name not in TOP else 'top'}) " \
                       f"imports from a floor above it: {upward}"


def test_nothing_below_the_front_door_imports_it():
    """Not even for `__version__` (the kernel's `version` holds it): `from minitfm import x`
    in a module below the front door is an arrow up, whatever `x` is."""
    assert sorted(name for name in set(MODULES) - TOP if "minitfm" in GRAPH[name]) == []


def test_the_checker_resolves_relative_imports():
    """`from ..app import cli` in the book is the worst upward arrow, however it is spelled."""
    source = "def f():\n    from ..app import cli\n    from . import attention\n"
    assert read_imports(source, "minitfm.book") == [("minitfm.app", ["cli"]),
                                                    ("minitfm.book", ["attention"])]
    assert read_imports("from .. import load_run\n", "minitfm.fast") == [
        ("minitfm", ["load_run"])]


def test_the_kernel_imports_only_the_kernel_below_it_and_no_torch():
    # A config reads the same without torch and on any machine.
    for i, name in enumerate(KERNEL):
        module = f"minitfm.{name}"
        assert GRAPH[module] <= {f"minitfm.{below}" for below in KERNEL[:i]}, GRAPH[module]
        found = {m for m, _ in file_imports(MODULES[module])}
        assert not [m for m in found if m.split(".")[0] == "torch"], module


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


def wing(name: str) -> tuple[int, str]:
    """Where a lab module sits inside the lab: (0, "") for a shared one (`minitfm.lab.loaded`),
    (1 + the floor's index in WINGS, the wing) for a module of a wing
    (`minitfm.lab.attention.probe` -> (2, "attention"))."""
    parts = name.split(".")
    wing_name = parts[2] if len(parts) > 2 else ""
    return next(((i + 1, wing_name) for i, names in enumerate(WINGS) if wing_name in names),
                (0, ""))


def wrong_wing_arrows(graph: dict[str, set[str]]) -> list[str]:
    """The imports of a lab module from a wing above its own or beside it (or of a shared module
    from any wing)."""
    def wrong(name: str, dep: str) -> bool:
        (floor, own), (dep_floor, dep_wing) = wing(name), wing(dep)
        return dep_floor > floor or (dep_floor == floor and dep_wing != own)

    lab = [name for name in graph if name.startswith("minitfm.lab")]
    return sorted(f"{name} -> {dep}" for name in lab for dep in graph[name]
                  if dep.startswith("minitfm.lab") and wrong(name, dep))


def test_every_lab_module_is_shared_or_in_a_wing():
    wings = {name for floor in WINGS for name in floor}
    for name in (m for m in MODULES if m.startswith("minitfm.lab.")):
        path = MODULES[name].relative_to(PACKAGE / "lab")
        assert len(path.parts) == 1 or path.parts[0] in wings, name


def test_the_lab_wings_import_their_own_floor_and_below_only():
    assert wrong_wing_arrows(GRAPH) == []


def test_the_wing_checker_finds_a_wrong_arrow():
    graph = {"minitfm.lab.attention.probe": {"minitfm.lab.many.runs", "minitfm.lab.measure.bench",
                                             "minitfm.lab.pictures"},
             "minitfm.lab.many.sweep": {"minitfm.lab.attention.probe", "minitfm.lab.measure.bench"},
             "minitfm.lab.measure.bench": {"minitfm.lab.watch.tb"},
             "minitfm.lab.pictures": {"minitfm.lab.many.plots"},
             "minitfm.lab.watch.gauges": {"minitfm.lab.interpret.ablate",
                                          "minitfm.lab.watch.forecast",
                                          "minitfm.lab.attention.probe"},
             "minitfm.lab.explore.explorer": {"minitfm.lab.interpret.ablate",
                                              "minitfm.lab.watch.gauges"}}
    assert wrong_wing_arrows(graph) == ["minitfm.lab.attention.probe -> minitfm.lab.many.runs",
                                        "minitfm.lab.measure.bench -> minitfm.lab.watch.tb",
                                        "minitfm.lab.pictures -> minitfm.lab.many.plots",
                                        "minitfm.lab.watch.gauges -> minitfm.lab.interpret.ablate"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_room_is_too_big(name):
    lines = len(MODULES[name].read_text(encoding="utf-8").splitlines())
    most = MAX_LAB_LINES if name.startswith("minitfm.lab") else MAX_LINES
    assert lines <= most, f"{name} has {lines} lines, at most {most}: split it by concern"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_docstring_is_too_long(name):
    """A module's docstring is its contract: what it holds and promises. Measurements and their
    dates live in docs/, beside the other numbers."""
    docstring = ast.get_docstring(ast.parse(MODULES[name].read_text(encoding="utf-8")),
                                  clean=False) or ""
    lines = len(docstring.splitlines())
    assert lines <= MAX_DOCSTRING_LINES, \
        f"{name}'s docstring has {lines} lines, at most {MAX_DOCSTRING_LINES}: keep the contract"


def rooms(package: Path) -> list[str]:
    """The modules (`name.py`) and subpackages (`name/`) of a package folder."""
    return sorted([p.name for p in package.glob("*.py") if p.name != "__init__.py"] +
                  [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()])


def unnamed(docstring: str, names: list[str]) -> list[str]:
    """The rooms a package's docstring does not name: a room is named as `name.py` or `name/`
    (not as another folder's: `book/model.py` names no `model.py` of its own), or as `name` in
    backquotes."""
    def named(room: str) -> bool:
        stem = room.removesuffix(".py").removesuffix("/")
        return bool(re.search(rf"(?<![\w/.]){re.escape(stem)}(\.py|/)(?![\w])", docstring) or
                    f"`{stem}`" in docstring)

    return [room for room in names if not named(room)]


PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_names_its_rooms(package):
    """A package's docstring is its map, read in order: it names each of its modules and
    subpackages, so that no room is missing from it (lab/look's named 10 of its 19)."""
    path = MODULES[package]
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    assert unnamed(docstring, rooms(path.parent)) == [], f"{package}'s docstring does not name them"


def test_the_map_checker_finds_an_unnamed_room():
    docstring = "`probe.py`: one input; `visualize`; `watch/` and book/model.py, `stack_key.py`"
    names = ["model.py", "probe.py", "stack.py", "visualize.py", "watch/", "explore/"]
    assert unnamed(docstring, names) == ["model.py", "stack.py", "explore/"]


def typer_commands() -> set[str]:
    """The functions the table of commands registers (`COMMANDS` in app/cli.py), as
    `module.function`."""
    from minitfm.app.cli import COMMANDS

    return {f"{c.__module__}.{c.__name__}" for c in COMMANDS.values() if inspect.isfunction(c)}


def is_typer_command(node: ast.FunctionDef, module: str) -> bool:
    """A function of the table of commands, `@app.command(...)` or `@app.callback()`: its
    parameters are the command's options."""
    return f"{module}.{node.name}" in typer_commands() or any(
        isinstance(d, ast.Call) and ast.unparse(d.func) in ("app.command", "app.callback")
        for d in node.decorator_list)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_public_function_takes_more_than_six_parameters(name):
    wide = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or \
                node.name.startswith("_") or is_typer_command(node, name):
            continue
        args = node.args
        params = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs
                  if a.arg not in ("self", "cls")]
        if len(params) > MAX_PARAMETERS:
            wide.append(f"{node.name} ({len(params)}: {', '.join(params)})")
    assert not wide, f"{name}: {wide}; pass an options object or a value that holds them"


def test_the_checker_sees_lazy_imports():
    """The reader above finds imports inside functions (where most of the CLI's are)."""
    assert "minitfm.run.session" in GRAPH["minitfm.app.cli"] | GRAPH["minitfm.app.api"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_swaps_its_class_or_sys_modules(name):
    """`sys.modules[__name__].__class__ = ...` made a module callable once; never again.

    One entry is importing, not a trick: a learner's workbook is a package at a path, which
    Python imports as importlib's recipe does, registered under a name of its own
    (`sys.modules[package]` in learn/workbook.py, `package` a fresh `minitfm_workbook_...`)."""
    imports = {"minitfm.learn.workbook": {"sys.modules[package]"}}.get(name, set())
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            text = ast.unparse(target)
            assert "__class__" not in text, f"{name}: {text}"
            assert "sys.modules" not in text or text in imports, f"{name}: {text}"


def test_the_books_tests_read_only_the_book_and_what_is_below_it():
    """`make test-book` checks the chapters alone: its tests import nothing above the book."""
    above = ("minitfm.fast", "minitfm.run", "minitfm.lab", "minitfm.app")
    for path in sorted((PACKAGE.parent / "tests" / "book").glob("*.py")):
        for module, _ in file_imports(path):  # `from ..helpers import x` is tests.helpers
            assert not module.startswith(above), f"{path.name}: {module}"
            if module == "tests.helpers":
                pytest.fail(f"{path.name} imports tests.helpers (the CLI's): use tests.book")
