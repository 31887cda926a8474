"""notebooks/tour.ipynb: shipped without outputs, and it runs from top to bottom.

The kernel is this test's own Python (the project's venv), from a kernel spec written into a
temporary folder: nothing is registered with Jupyter. The parameters cell is replaced to train
a tiny model, so the whole notebook runs in seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest

NOTEBOOK = Path(__file__).parent.parent / "notebooks" / "tour.ipynb"
QUICK = {  # reverse 1..8 in 40 steps: far from solved, but every cell has something to show
    "task.max_len": 8, "model.d_model": 32, "model.n_heads": 2, "model.n_encoder_layers": 1,
    "model.n_decoder_layers": 1, "model.d_ff": 64, "train.steps": 40, "train.batch_size": 64,
    "train.warmup_steps": 10, "train.eval_every": 20, "train.eval_samples": 100,
    "log.tensorboard": False, "log.attention_every": 0,
}


def test_the_shipped_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code and all(not cell.outputs and cell.execution_count is None for cell in code)


def venv_kernel(folder: Path):
    """A KernelManager that starts ipykernel with this interpreter, registered nowhere."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    spec = folder / "kernels" / "minitfm-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minitfm test", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
    return KernelManager(kernel_name="minitfm-test", kernel_spec_manager=specs)


@pytest.mark.slow  # starts a Jupyter kernel
def test_the_tour_runs(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (parameters,) = [cell for cell in nb.cells if "parameters" in cell.metadata.get("tags", [])]
    overrides = {**QUICK, "log.dir": str(tmp_path / "runs")}
    parameters.source = f"config = None\noverrides = {overrides!r}"
    client = nbclient.NotebookClient(nb, km=venv_kernel(tmp_path), timeout=300,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, on an error
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) == 2  # the cross-attention maps, the per-length bars
    text = "".join(out.get("text", "") + out.get("data", {}).get("text/plain", "")
                   for out in outputs)
    assert "exact match on lengths 17..32" in text and "Run(checkpoint=" in text
    assert len(list((tmp_path / "runs").glob("reverse-*/checkpoints/best.pt"))) == 1
