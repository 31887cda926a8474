"""The lab: instruments over runs and models, in wings named by the question each answers.

- `measure/`: how well and how fast: `eval`, `predict`, `bench` and its plain reference trainers;
- `attention/`: what the heads look at: one input's maps and alignments, attention over training;
- `interpret/`: what each head does, by cause: `ablate`, `patch`, the logit lens, `explain`;
- `watch/`: a run as it trains: the gauges, the forecast, grokking's gauges, TensorBoard, MLflow;
- `explore/`: `minitfm explore`, a run in one offline page;
- `many/`: many runs: `runs`, `plot`, `sweep` (its grid, its scheduler, its results), `compare`.

What they share sits here: a trained run loaded once (`loaded.py`), each command's options
(`options.py`), a run's curves from metrics.jsonl (`curves.py`), one picture rule with one
palette (`pictures.py`), and how a Python process of minitfm's own starts (`child_process.py`).
The wings are floors inside the lab, bottom to top: these shared modules, `measure`,
`attention`, `interpret` and `watch` side by side (neither imports the other), `explore`,
`many`; a module may import its own wing and the floors below it (tests/test_architecture.py).
"""
