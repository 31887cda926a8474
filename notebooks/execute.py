"""Run notebooks/tour.ipynb from top to bottom and write it back with its outputs (`make notebook`).

The notebook ships executed, so that anyone browsing it (on a forge, in an editor) sees its
pictures and numbers. This script regenerates them: it runs every cell as a learner would, from
the notebooks/ folder (the run goes to the repository's runs/), with the kernel pinned to
`OMP_NUM_THREADS=2` so that `threads=auto` resolves to 2 whatever else runs on the machine and a
second run on the same machine repeats the numbers (another CPU gives slightly different ones).
The kernel is this interpreter (the project's venv), from a kernel spec written into a temporary
folder: nothing is registered with Jupyter. The notebook's metadata records a digest of its code
cells, which tests/test_notebook.py compares with the code: edit a cell, run `make notebook`. It
also records a digest of each of the package's Python files, which shape the outputs (the tour
trains, evaluates, probes attention and grades with `check`): after a package edit the test
warns, naming the files, until `make notebook` has run again.

    .venv/bin/python notebooks/execute.py
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

NOTEBOOK = Path(__file__).resolve().parent / "tour.ipynb"
ROOT = NOTEBOOK.parent.parent
SOURCES = "minitfm/**/*.py"  # what the tour runs reaches most of the package: all of it counts
THREADS = 2  # OMP_NUM_THREADS of the kernel: a fixed thread count repeats bit for bit


def kernel(folder: Path, env: dict[str, str] | None = None):
    """A KernelManager that starts ipykernel with this interpreter, registered nowhere. It
    talks to the kernel over Unix sockets in `folder` (IPC): over TCP, the default, the kernel
    warns that anyone on the machine could listen in, which alarms a learner for nothing."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    spec = folder / "kernels" / "minitfm"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "minitfm", "language": "python", "env": env or {}}))
    specs = KernelSpecManager(kernel_dirs=[str(folder / "kernels")])
    return KernelManager(kernel_name="minitfm", kernel_spec_manager=specs, transport="ipc",
                         ip=str(folder / "kernel"))


def code_digest(nb: nbformat.NotebookNode) -> str:
    """sha256 of the code cells' sources: what the shipped outputs were made from."""
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    return hashlib.sha256(json.dumps(code).encode()).hexdigest()


def source_digests(root: Path = ROOT) -> dict[str, str]:
    """The package's Python files (`SOURCES` under `root`), each with the first 16 hex digits
    of its sha256: what the shipped outputs were made with."""
    return {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            for path in sorted(root.glob(SOURCES))}


def execute(nb: nbformat.NotebookNode, folder: Path, cwd: Path,
            env: dict[str, str] | None = None) -> None:
    """Run every cell of `nb` in place, in `cwd`; `folder` holds the kernel spec.

    Raises nbclient's CellExecutionError, with the cell and its traceback, on an error.
    """
    client = nbclient.NotebookClient(nb, km=kernel(folder, env), timeout=600,
                                     record_timing=False,  # no timestamps in the shipped file
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()


def main() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    kernelspec = nb.metadata.get("kernelspec")
    with tempfile.TemporaryDirectory() as folder:
        execute(nb, Path(folder), NOTEBOOK.parent, env={"OMP_NUM_THREADS": str(THREADS)})
    if kernelspec is not None:  # the learner's Jupyter picks its own python3 kernel
        nb.metadata["kernelspec"] = kernelspec
    nb.metadata["minitfm"] = {"code_sha256": code_digest(nb),
                              "sources": source_digests(),
                              "regenerate": "make notebook",
                              "OMP_NUM_THREADS": THREADS}
    nbformat.validate(nb)
    nbformat.write(nb, NOTEBOOK)
    images = sum("image/png" in out.get("data", {}) for cell in nb.cells
                 for out in cell.get("outputs", []))
    print(f"wrote {NOTEBOOK.name} with its outputs: {images} pictures, "
          f"{NOTEBOOK.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
