"""`make figures`: remake every figure of docs/ that a command makes, and the numbers the docs
quote.

Run it on an idle machine after a change of the default (config, schedule, code): it trains
into a scratch folder with the commands a reader would type, copies their pictures into docs/,
and writes docs/figures.json, the numbers of those runs. tests/test_docs.py holds the docs to
that file: where a page quotes a figure it no longer has, the test names it.

Steps (`--only` picks some; each keeps the others' entries in figures.json):

- `default`: `minitfm train threads=2` (the default, seed 0), then `visualize-attention
  --over-training` -> docs/over-training-reverse.png (256 colours), `ablate` ->
  docs/ablate-reverse.png, `explain` -> docs/explain-reverse.png (256 colours) and `patch` ->
  docs/patch-reverse.png; figures.json `default`: exact match at each evaluation, where the
  run stopped, the best aligned head's alignment and entropy at each snapshot.
- `configs`: every shipped config, `minitfm train configs/<name>.yaml threads=2` (dates after
  `make data`); figures.json `configs`: exact match and the step each stopped at.
- `lengthgen`: the sweep of docs/experiments.md (18 runs: most of the time) ->
  docs/lengthgen.png; figures.json `lengthgen`: exact match per range of every configuration.
- `grokking`: `minitfm train configs/grokking.yaml` (seed 0, 1 thread as the config says),
  then its three phases drawn from the run's metrics.jsonl (`draw_phases` of
  minitfm.lab.watch.phases, which `minitfm plot RUN --phases` runs on a run of one's own, in a
  process of its own) -> docs/grokking.png; figures.json
  `grokking`: where each phase ended, the gauges there, where the run stopped, its wall time.
- `notebook`: notebooks/execute.py (`make notebook`), which writes notebooks/tour.ipynb.

    .venv/bin/python docs/make_figures.py                    # everything (make figures)
    .venv/bin/python docs/make_figures.py --only default     # one step
    .venv/bin/python docs/make_figures.py --dry-run          # the commands, one per line
    .venv/bin/python docs/make_figures.py --tiny --out DIR   # a few steps each, all into DIR

`--tiny` checks the script in a minute: small models and few steps, a smaller lengthgen grid,
no notebook, pictures and figures.json into `--out` (docs/ is left alone). Standard library
and Pillow only: everything else is a `minitfm` command (or, for grokking's figure, a function
of minitfm run in its own process).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
STEPS = ("default", "configs", "lengthgen", "grokking", "notebook")
CONFIGS = ("reverse", "copy", "shift", "sort", "duplicate", "add", "dates")  # docs/config.md
THREADS = ["threads=2"]  # part of every recipe in the docs: a fixed count repeats bit for bit
LENGTHGEN = ["configs/lengthgen-copy.yaml", "--name", "lengthgen", "task.name=copy,reverse",
             "model.positional=sinusoidal,learned,rope,alibi,none",
             "model.random_positions=null,64", "--skip-invalid",
             "--eval-lengths", "17..32", "--eval-lengths", "17..24"]  # docs/experiments.md
TINY = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "train.steps=20",
        "train.warmup_steps=5", "train.eval_every=10", "train.eval_samples=50"]
TINY_GROKKING = ["task.n_symbols=11", "train.batch_size=36", "train.eval_samples=85",
                 "train.steps=20", "train.eval_every=10"]  # 36 of the 121 pairs: full batch
TINY_LENGTHGEN = ["configs/lengthgen-copy.yaml", "--name", "lengthgen", "task.name=copy,reverse",
                  "model.positional=sinusoidal,rope", "model.random_positions=null,64",
                  "--eval-lengths", "17..20", "--eval-samples", "50", *TINY]


class Figures:
    """One `make figures`: where runs and pictures go, and what it has found so far."""

    def __init__(self, out: Path, scratch: Path, tiny: bool, dry_run: bool):
        self.out, self.scratch = from_root(out), from_root(scratch)  # the commands run there
        self.tiny, self.dry_run = tiny, dry_run
        self.found: dict = {}

    def run(self, *args: str) -> None:
        """A command from the repository's root, echoed first; a failure stops everything."""
        print(shlex.join(["python", *args]), flush=True)
        code = 0 if self.dry_run else subprocess.run([sys.executable, *args], cwd=ROOT).returncode
        if code:
            sys.exit(f"make figures: the command above failed (exit {code}); docs/ keeps what "
                     f"was copied so far, figures.json is unchanged")

    def minitfm(self, *args: str) -> None:
        self.run("-m", "minitfm", *args)

    def train(self, name: str, config: list[str]) -> Path:
        """`minitfm train CONFIG threads=2 --run-dir <scratch>/<name> --overwrite`."""
        run_dir = self.scratch / name
        self.minitfm("train", *config, *THREADS, *(TINY if self.tiny else []),
                     "--run-dir", str(run_dir), "--overwrite")
        return run_dir

    def picture(self, made: Path, name: str, colours: int | None = None) -> None:
        """Copy a picture the commands made to `<out>/<name>` (with `colours`: reduced)."""
        target = self.out / name
        if "*" in made.name and not self.dry_run:  # named after the step the run stopped at
            made = next((ROOT / made.parent).glob(made.name)).relative_to(ROOT)
        print(f"copy {made} -> {target}" + (f" ({colours} colours)" if colours else ""))
        if self.dry_run:
            return
        if colours is None:
            shutil.copyfile(ROOT / made, ROOT / target)
        else:
            from PIL import Image

            picture = Image.open(ROOT / made).convert("RGB").quantize(colours)
            picture.save(ROOT / target, optimize=True)

    # --- the steps ---

    def default(self) -> None:
        run_dir = self.train("default", [])
        over, ablate = self.scratch / "over-training.png", self.scratch / "ablate.png"
        self.minitfm("visualize-attention", str(run_dir), "--over-training", "--out", str(over),
                     "--force")
        self.minitfm("ablate", str(run_dir), "--out", str(ablate), "--force",
                     *(["--samples", "50"] if self.tiny else []))
        roles, patched = self.scratch / "explain", self.scratch / "patch.png"
        self.minitfm("explain", str(run_dir), "--out", str(roles), "--force",
                     *(["--samples", "50"] if self.tiny else []))
        self.minitfm("patch", str(run_dir), "--out", str(patched), "--force")
        self.picture(over, "over-training-reverse.png", colours=256)
        self.picture(ablate, "ablate-reverse.png")
        self.picture(roles / "best-step*.png", "explain-reverse.png", colours=256)
        self.picture(patched, "patch-reverse.png")
        if not self.dry_run:
            self.found["default"] = run_figures(ROOT / run_dir)

    def configs(self) -> None:
        if not (ROOT / "examples" / "dates" / "train.tsv").is_file():  # make data
            self.run("examples/dates/make_data.py")
        found = {}
        for name in CONFIGS:
            run_dir = self.train(f"config-{name}", [f"configs/{name}.yaml"])
            if not self.dry_run:
                found[f"{name}.yaml"] = where_it_stopped(ROOT / run_dir)
        self.found["configs"] = found

    def lengthgen(self) -> None:
        folder = self.scratch / "lengthgen"
        if (ROOT / folder / "sweep.json").is_file() and not self.dry_run:
            shutil.rmtree(ROOT / folder)  # a sweep of other code would resume: start afresh
        self.minitfm("sweep", *(TINY_LENGTHGEN if self.tiny else LENGTHGEN), "--out", str(folder))
        self.picture(folder / "results.png", "lengthgen.png")
        if not self.dry_run:
            self.found["lengthgen"] = sweep_figures(ROOT / folder)

    def grokking(self) -> None:
        """configs/grokking.yaml as docs/looking-inside.md gives it (its threads are the
        config's: 1), then the figure of its phases."""
        run_dir = self.scratch / "grokking"
        self.minitfm("train", "configs/grokking.yaml", *(TINY_GROKKING if self.tiny else []),
                     "--run-dir", str(run_dir), "--overwrite")
        figure = self.scratch / "grokking.png"
        self.run("-c", "import json, sys; from minitfm.lab.watch.phases import draw_phases; "
                 "json.dump(draw_phases(sys.argv[1], sys.argv[2]), open(sys.argv[3], 'w'))",
                 str(run_dir), str(figure), str(self.scratch / "grokking.json"))
        self.picture(figure, "grokking.png")
        if not self.dry_run:
            phases = json.loads((ROOT / self.scratch / "grokking.json").read_text())
            self.found["grokking"] = {**phases, "stopped": where_it_stopped(ROOT / run_dir),
                                      "wall_s": round(read_summary(ROOT / run_dir)["wall_s"])}

    def notebook(self) -> None:
        if self.tiny:
            print("(--tiny: no notebook; make notebook runs it)")
            return
        self.run("notebooks/execute.py")

    def write(self) -> None:
        """figures.json: the entries found now over those of the file already there."""
        path = ROOT / self.out / "figures.json"
        if self.dry_run:
            print(f"write {from_root(path)}")
            return
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        made = {"made_by": "make figures (docs/make_figures.py)",
                "date": datetime.date.today().isoformat(),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores", "tiny": self.tiny}
        path.write_text(json.dumps({**old, **made, **self.found}, indent=1) + "\n",
                        encoding="utf-8")
        print(f"wrote {from_root(path)}")


def from_root(path: Path) -> Path:
    """`path` relative to the repository's root when inside it (the commands run there)."""
    whole = path.resolve()
    return whole.relative_to(ROOT) if whole.is_relative_to(ROOT) else whole


# --- reading the runs ---

def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))


def where_it_stopped(run_dir: Path) -> dict:
    """The run's last evaluation: exact match, step, why it ended (summary.json)."""
    summary = read_summary(run_dir)
    return {"exact_match": round(summary["exact_match"], 4), "step": summary["step"],
            "status": summary["status"]}


def run_figures(run_dir: Path) -> dict:
    """A run's exact match at each evaluation, where it stopped, and its best aligned
    cross-attention head (at the last snapshot): alignment and entropy at each snapshot."""
    evaluations = {str(r["step"]): round(r["exact_match"], 4)
                   for r in read_lines(run_dir / "metrics.jsonl") if r["split"] == "eval"}
    snapshots = read_lines(run_dir / "attention.jsonl")
    last = snapshots[-1]["alignment"]  # (layers, heads)
    layer, head = max(((i, j) for i, row in enumerate(last) for j in range(len(row))),
                      key=lambda ij: last[ij[0]][ij[1]])
    return {"evaluations": evaluations, "stopped": where_it_stopped(run_dir),
            "best_head": [layer, head],
            "snapshots": [{"step": s["step"], "exact_match": s["exact_match"],
                           "alignment": round(s["alignment"][layer][head], 4),
                           "entropy": round(s["entropy"][layer][head], 4)} for s in snapshots]}


def sweep_figures(folder: Path) -> list[dict]:
    """Every run of a sweep (results.jsonl): its swept values and exact match per range."""
    return [{"task": row.get("task.name"), "positional": row.get("model.positional"),
             "random_positions": row.get("model.random_positions"),
             "exact_match": {span: None if v is None else round(v, 4)
                             for span, v in row["exact_match"].items()}}
            for row in read_lines(folder / "results.jsonl")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--only", action="append", choices=STEPS,
                        help="a step to run (again for several); default: every step")
    parser.add_argument("--tiny", action="store_true", help="tiny runs, to check the script")
    parser.add_argument("--out", type=Path, help="pictures and figures.json (default docs/; "
                        "needed with --tiny)")
    parser.add_argument("--scratch", type=Path, help="the runs (default runs/figures, or "
                        "OUT/runs with --tiny)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    if args.tiny and args.out is None:
        parser.error("--tiny needs --out DIR: tiny figures never replace those in docs/")
    out = args.out or DOCS
    scratch = args.scratch or (out / "runs" if args.tiny else ROOT / "runs" / "figures")
    figures = Figures(out, scratch, args.tiny, args.dry_run)
    if not args.dry_run:
        (ROOT / figures.out).mkdir(parents=True, exist_ok=True)
    for step in STEPS:
        if args.only is None or step in args.only:
            getattr(figures, step)()
    figures.write()


if __name__ == "__main__":
    main()
