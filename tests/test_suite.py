"""The suite's own rules: a module's tests are found from its place in the package, and a test
that needs a CUDA device says so with the `cuda` marker."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent
PACKAGE = TESTS.parent / "minitfm"
# The test files at the top of tests/ that test no one package: the project as a whole.
WHOLE_PROJECT = {
    "test_architecture.py": "the floors of every package, and the size of every module",
    "test_docs.py": "the README and docs/ against the code and its outputs",
    "test_notebook.py": "notebooks/tour.ipynb, run top to bottom",
    "test_suite.py": "the rules of tests/ itself",
    "test_refuse_inputs.py": "the adversarial report's hostile inputs, a case from every floor",
}


def needs_cuda(function: ast.FunctionDef) -> bool:
    """True when a test calls into torch.cuda or puts something on a "cuda" device (a dict's key
    "cuda", as in a checkpoint's random streams, names no device)."""
    keys = {id(key) for node in ast.walk(function) if isinstance(node, ast.Dict)
            for key in node.keys}
    for node in ast.walk(function):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.value.value, ast.Name) \
                and (node.value.value.id, node.value.attr) == ("torch", "cuda"):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in keys and node.value.split(":")[0] in ("cuda", "device=cuda"):
            return True
    return False


def marked_cuda(function: ast.FunctionDef) -> bool:
    """True when `@pytest.mark.cuda` decorates the function."""
    return any(ast.unparse(d) == "pytest.mark.cuda" for d in function.decorator_list)


def test_every_cuda_test_has_the_cuda_marker():
    assert needs_cuda(ast.parse("def f():\n    torch.cuda.synchronize()\n").body[0])
    assert needs_cuda(ast.parse("def f():\n    tiny('device=cuda')\n").body[0])
    assert not needs_cuda(ast.parse("def f():\n    run('device=tpu')\n").body[0])
    assert not needs_cuda(ast.parse("def f():\n    rng = {'cuda': []}\n").body[0])
    assert needs_cuda(ast.parse("def f():\n    run({'device': 'cuda'})\n").body[0])
    unmarked = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") \
                    and needs_cuda(node) and not marked_cuda(node):
                unmarked.append(f"{path.relative_to(TESTS)}::{node.name}")
    assert unmarked == []


def misplaced(tests: Path, package: Path) -> list[str]:
    """The test files of `tests` found nowhere near what they test: each test_*.py sits in the
    folder of `package` it tests (tests/run/test_resume.py: minitfm/run/), a package folder
    (one with an __init__.py, as each folder on the way in tests/ has one too); at the top, a
    kernel module's tests are named after it (test_config.py: minitfm/config.py) and the
    others test the project as a whole (`WHOLE_PROJECT`)."""
    kernel = {f"test_{path.name}" for path in package.glob("*.py")}
    wrong = []
    for path in sorted(tests.rglob("test_*.py")):
        folder = path.parent.relative_to(tests)
        if folder == Path("."):
            if path.name not in kernel | set(WHOLE_PROJECT):
                wrong.append(f"{path.name}: tests no kernel module of {package.name}/ and is "
                             "no whole-project test: move it to the folder of its package")
        elif not (package / folder / "__init__.py").is_file():
            wrong.append(f"{folder / path.name}: {package.name}/{folder.as_posix()} is no package")
        for parent in [path.parent, *path.parent.parents]:
            if parent == tests:
                break
            if not (parent / "__init__.py").is_file():
                wrong.append(f"{folder / path.name}: {parent.relative_to(tests)} has no "
                             "__init__.py")
    return wrong


def test_every_test_file_sits_in_the_folder_of_its_package(tmp_path):
    assert all((TESTS / name).is_file() for name in WHOLE_PROJECT), "a stale WHOLE_PROJECT"
    assert misplaced(TESTS, PACKAGE) == []
    # the rule at work on a made-up suite and package
    for name in ("pkg/config.py", "pkg/run/__init__.py", "pkg/lab/__init__.py",
                 "pkg/lab/watch/__init__.py", "pkg/lab/page/app.js"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    for name in ("tests/test_config.py", "tests/test_docs.py", "tests/test_resume.py",
                 "tests/run/__init__.py", "tests/run/test_resume.py",
                 "tests/lab/__init__.py", "tests/lab/watch/__init__.py",
                 "tests/lab/watch/test_gauges.py", "tests/lab/page/__init__.py",
                 "tests/lab/page/test_page.py", "tests/fast/test_fast.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert [line.split(":")[0] for line in misplaced(tmp_path / "tests", tmp_path / "pkg")] == \
        ["fast/test_fast.py", "fast/test_fast.py", "lab/page/test_page.py", "test_resume.py"]
