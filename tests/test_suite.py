"""The suite's own rules: a test that needs a CUDA device says so with the `cuda` marker."""

import ast
from pathlib import Path

TESTS = Path(__file__).parent


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
