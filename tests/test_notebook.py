"""notebooks/tour.ipynb: shipped with the outputs of its own code, and it runs top to bottom.

The shipped copy is made by `make notebook` (notebooks/execute.py): anyone browsing it sees its
pictures. An edit of its code cells fails here until it is made again; an edit of the package
only warns (`StaleOutputs`, naming the files): most package edits leave the outputs as they were,
remaking them trains the default run and rewrites the pictures, and another CPU gives slightly
different numbers, so a failure on every package edit would force a remake that mostly checks
nothing. The warning says when the numbers have not been checked against the code since.

The run here uses the same kernel (this test's own Python, from a kernel spec written into a
temporary folder: nothing is registered with Jupyter), with the parameters cell replaced to
train a tiny model, so the whole notebook runs in seconds.
"""

from __future__ import annotations

import base64
import importlib.util
import re
import shutil
import warnings
from pathlib import Path

import nbformat
import pytest

from minitfm.config import Config

ROOT = Path(__file__).parent.parent
NOTEBOOK = ROOT / "notebooks" / "tour.ipynb"
QUICK = {  # reverse 1..8 in 40 steps: far from solved, but every cell has something to show
    "task.max_len": 8, "model.d_model": 32, "model.n_heads": 2, "model.n_encoder_layers": 1,
    "model.n_decoder_layers": 1, "model.d_ff": 64, "train.steps": 40, "train.batch_size": 64,
    "train.warmup_steps": 10, "train.eval_every": 20, "train.eval_samples": 100,
    "log.tensorboard": False, "log.attention_every": 0,
}
PICTURES = 2  # the cross-attention maps, the per-length bars
PICTURE_BYTES = 150_000  # each PNG output; the whole file stays a few hundred KB
NOTEBOOK_BYTES = 400_000


def load_execute():
    """notebooks/execute.py, the script behind `make notebook`, as a module."""
    spec = importlib.util.spec_from_file_location("execute", ROOT / "notebooks" / "execute.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(nb) -> list:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def output_text(nb) -> str:
    return "".join(out.get("text", "") + out.get("data", {}).get("text/plain", "")
                   for out in outputs(nb))


def pictures(nb) -> list[bytes]:
    return [base64.b64decode(out["data"]["image/png"]) for out in outputs(nb)
            if "image/png" in out.get("data", {})]


@pytest.fixture(scope="module")
def shipped():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    return nb


def test_the_shipped_notebook_has_its_outputs(shipped):
    code = [cell for cell in shipped.cells if cell.cell_type == "code"]
    assert code and all(cell.outputs for cell in code[1:]), "run `make notebook`"
    assert not code[0].outputs  # the parameters cell only assigns
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    assert not [out for out in outputs(shipped) if out.output_type == "error"]
    images = pictures(shipped)
    assert len(images) == PICTURES
    assert all(image.startswith(b"\x89PNG") and len(image) < PICTURE_BYTES for image in images)
    assert NOTEBOOK.stat().st_size < NOTEBOOK_BYTES


def test_the_shipped_outputs_come_from_the_shipped_code(shipped):
    """Edit a code cell and this fails until `make notebook` has made its outputs again."""
    stamp = shipped.metadata.get("minitfm", {})
    assert stamp.get("code_sha256") == load_execute().code_digest(shipped), (
        "the notebook's code changed since its outputs were made: run `make notebook`")
    assert stamp.get("regenerate") == "make notebook"


class StaleOutputs(UserWarning):
    """The package changed since the notebook's outputs were made."""


def stale_sources(made: dict[str, str], now: dict[str, str]) -> list[str]:
    """The package files added, removed or changed between two `source_digests`."""
    return sorted(path for path in made.keys() | now.keys() if made.get(path) != now.get(path))


def test_the_shipped_outputs_were_made_with_the_package_as_it_is(shipped):
    """Warns (never fails: see the module's docstring) when a package file changed since
    `make notebook`, naming the files."""
    now = load_execute().source_digests()
    assert {"minitfm/book/loop.py", "minitfm/run/schedule.py", "minitfm/config.py",
            "minitfm/learn/grading.py"} <= now.keys()  # training, its cadence, the default, check
    made = shipped.metadata.get("minitfm", {}).get("sources")
    changed = stale_sources(made or {}, now)
    if not made:
        why = "record no digests of the package (made by an older `make notebook`)"
    else:
        why = "were made before a change to " + ", ".join(changed[:4]) + (
            f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    if changed:
        warnings.warn(StaleOutputs(f"notebooks/tour.ipynb's outputs {why}: run `make notebook` "
                                   f"to check that its numbers still hold"), stacklevel=1)


def test_a_package_edit_shows_in_the_source_digests(tmp_path):
    execute = load_execute()
    for name in ("minitfm/run/schedule.py", "minitfm/book/loop.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    before = execute.source_digests(tmp_path)
    assert before == {name: execute.source_digests()[name] for name in before} and len(before) == 2
    with (tmp_path / "minitfm/run/schedule.py").open("a") as file:
        file.write("# a quick check starts one step later\n")
    assert stale_sources(before, execute.source_digests(tmp_path)) == ["minitfm/run/schedule.py"]
    (tmp_path / "minitfm/book/loop.py").unlink()
    assert stale_sources(before, execute.source_digests(tmp_path)) == [
        "minitfm/book/loop.py", "minitfm/run/schedule.py"]


def test_the_shipped_outputs_are_a_default_run_anyone_could_make(shipped):
    """The built-in default, 2 threads, run from notebooks/: no path of the machine it ran on."""
    text = output_text(shipped)
    steps = Config().train.steps
    assert f"steps 0/{steps}" in text and "2 threads" in text
    assert "../runs/reverse-" in text
    assert str(ROOT) not in text and not re.search(r"(/home/|/Users/|/tmp/|[A-Z]:\\)", text)


def test_the_notebook_states_the_default_it_trains(shipped):
    """The settings cell's figures are the built-in default's (they once said 400 steps)."""
    default = Config()
    prose = " ".join(cell.source for cell in shipped.cells if cell.cell_type == "markdown")
    prose = " ".join(prose.split())
    assert f"lengths {default.task.min_len}..{default.task.max_len}, " in prose
    assert re.findall(r"(\d+) steps", prose) == [str(default.train.steps)]
    assert re.findall(r"(\d+) threads", prose) == [str(load_execute().THREADS)]


@pytest.mark.slow  # starts a Jupyter kernel
def test_the_tour_runs(tmp_path):
    execute = load_execute()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (parameters,) = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    overrides = {**QUICK, "log.dir": str(tmp_path / "runs")}
    parameters.source = f"config = None\noverrides = {overrides!r}"
    for cell in nb.cells:  # run from scratch, not on top of the shipped outputs
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    execute.execute(nb, tmp_path / "kernel", tmp_path)  # raises CellExecutionError on an error
    assert len(pictures(nb)) == PICTURES
    text = output_text(nb)
    assert "exact match on lengths 17..32" in text and "Run(checkpoint=" in text
    assert len(list((tmp_path / "runs").glob("reverse-*/checkpoints/best.pt"))) == 1


def test_the_kernel_talks_over_unix_sockets_in_its_own_folder(tmp_path):
    """`make notebook` printed ipykernel's warning that a kernel over TCP can be eavesdropped
    on: its kernel uses IPC, with the sockets in the kernel's temporary folder."""
    manager = load_execute().kernel(tmp_path)
    assert manager.transport == "ipc" and manager.ip.startswith(str(tmp_path))
