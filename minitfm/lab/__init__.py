"""The lab: instruments over runs and models, in three wings by concern.

- `measure/`: how well and how fast: `eval`, `predict`, `bench` and its plain reference trainers;
- `look/`: looking inside a model: one input through it and how its heads align, attention
  figures, TensorBoard's pictures, attention over training, ablations, the explorer's page;
- `many/`: many runs: `runs`, `plot`, `sweep` (its grid, its scheduler, its results).

What they share sits here: a trained run loaded once (`loaded.py`), each command's options
(`options.py`), a run's curves from metrics.jsonl (`curves.py`), one picture rule with one
palette (`pictures.py`), and how a Python process of minitfm's own starts (`child_process.py`).
The wings are floors inside the lab, bottom to top: these shared modules, `measure`, `look`,
`many`; a module may import its own floor and those below it (tests/test_architecture.py
holds it).
"""
