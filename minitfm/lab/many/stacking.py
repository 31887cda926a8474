"""Stacking: the runs of a sweep that share a model shape, trained in one job as one stacked
model (`run/stack.py`; the maths is `fast/stack.py`).

`minitfm sweep` groups the runs that still have work by `run/stack_key.py` and cuts each group
into stacks (`plan_stacks`): as many as jobs run at once, none larger than the memory holds. A
stack's job is one command, `minitfm stack FOLDER ID...` (`stack_command`): it trains those of
its runs that have not ended, as one stack (several in turn where the device's memory holds
fewer), then evaluates every range of every run together and writes each run's `eval-A-B.json`
as `minitfm eval --json` would (`run_stack_job`). Whether a sweep stacks is `choose_stacking`'s
to say: where it pays, or as `--stack/--no-stack` asks. No torch here but in `run_stack_job`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from minitfm.errors import MinitfmError, quote
from minitfm.lab.child_process import python_module
from minitfm.lab.many.grid import Grid, RunSpec, plan_runs
from minitfm.lab.many.results import eval_path, eval_ranges
from minitfm.lab.many.runs import read_record
from minitfm.lab.many.scheduler import PROCESS_BYTES, Job
from minitfm.run.files import to_json, write_atomic
from minitfm.run.limits import available_bytes, check_fits, gpu_free_bytes, training_parts
from minitfm.run.stack_key import stack_key
from minitfm.run.summary import DONE, read_summary, run_status


def stack_command(folder: Path, specs: list[RunSpec], threads: int, samples: int,
                  ranges: list[tuple[int, int]]) -> list[str]:
    """`minitfm stack FOLDER ID...`: train and evaluate these runs of the sweep as one stack."""
    lengths = [item for lo, hi in ranges for item in ("--eval-lengths", f"{lo}..{hi}")]
    return [*python_module("minitfm"), "stack", str(folder),
            *(spec.id for spec in specs), "--threads", str(threads), "--eval-samples",
            str(samples), *lengths]


def choose_stacking(runs: list[RunSpec], requested: bool | None) -> tuple[bool, str]:
    """Whether the sweep stacks its runs, and the words that say why.

    Asked (`--stack`/`--no-stack`): as asked. Else where it pays: on a GPU, where one step of a
    small model costs launches, not arithmetic, and R runs cost about what one does; not on a
    CPU, where a step of R stacked runs costs what R steps alone cost, or more (docs/speed.md)."""
    stackable = any(len(group) > 1 for group in groups(runs))
    if requested is not None:
        if requested and not stackable:
            return False, "nothing to stack: no two runs share a model shape (--stack)"
        return requested, "as asked (--stack)" if requested else "as asked (--no-stack)"
    if not stackable:
        return False, "no two runs share a model shape"
    if not on_gpu(runs[0].cfg.device):
        return False, ("on the CPU a stack is no faster than its runs one by one (docs/speed.md); "
                       "--stack stacks them")
    return True, "on the GPU a stack of runs costs about what one run costs; --no-stack trains " \
                 "them one by one"


def on_gpu(device: str) -> bool:
    """Whether runs of `device` (config's `device`) train on a GPU (auto: if torch sees one)."""
    if device == "cpu":
        return False
    if device.startswith("cuda"):
        return True
    import torch  # only here: the rest of the sweep runs without it

    return bool(torch.cuda.is_available())


def groups(runs: list[RunSpec]) -> list[list[RunSpec]]:
    """The runs by `stack_key`, in the grid's order; a workbook's runs each alone."""
    found: dict[str, list[RunSpec]] = {}
    alone = []
    for spec in runs:
        key = stack_key(spec.cfg)
        if key is None:
            alone.append([spec])
        else:
            found.setdefault(key, []).append(spec)
    return [*found.values(), *alone]


def plan_stacks(runs: list[RunSpec], parallel: int) -> list[list[RunSpec]]:
    """The runs cut into stacks: each group of one shape into `parallel` stacks (as many as
    run at once), yet two runs or more a stack where the group holds them (fewer jobs than
    asked beat none stacked), each small enough that `parallel` of them fit in memory together
    (a group where not even two fit is left in stacks of one: see `unstacked_why`)."""
    stacks = []
    for group in groups(runs):
        per_run = sum(size for _, _, size in training_parts(group[0].cfg))
        room = (available_bytes() // max(parallel, 1) - PROCESS_BYTES) // max(per_run, 1)
        size = max(1, min(max(math.ceil(len(group) / parallel), 2), room))
        stacks += [group[i:i + size] for i in range(0, len(group), size)]
    return stacks


def unstacked_why(parallel: int) -> str:
    """Why stacks planned with `plan_stacks` hold one run each: the memory."""
    if parallel > 1:
        return (f"the memory holds one run of each shape per job at {parallel} jobs at once; "
                f"lower --jobs to make room for stacks")
    return "the memory holds one run of each shape at a time"


def stacks_text(working: list[Job]) -> str:
    """`in 2 stacks of 4 runs` (`... of 4 or 3 runs and 1 run alone`): the jobs left to run,
    a stack each, or a run alone."""
    stacks = [job for job in working if job.others]
    sizes = " or ".join(map(str, sorted({len(job.specs) for job in stacks}, reverse=True)))
    alone = len(working) - len(stacks)
    rest = f" and {alone} run{'s' if alone > 1 else ''} alone" if alone else ""
    return f"in {len(stacks)} stack{'s' if len(stacks) > 1 else ''} of {sizes} runs{rest}"


def done_text(done: list[RunSpec], stacking: bool) -> str:
    """`, trained alone` (`, 3 of them trained alone`): how the runs already done were
    trained, where that is not how this sweep trains (stacked or not); else nothing."""
    other = [spec for spec in done
             if ("stack" in (read_summary(spec.run_dir) or {})) != stacking]
    if not other:
        return ""
    how = "alone" if stacking else "stacked"
    return f", trained {how}" if len(other) == len(done) else \
        f", {len(other)} of them trained {how}"


# --- the job: `minitfm stack FOLDER ID...` ---

def stack_members(folder: Path, ids: list[str], threads: int) -> list[RunSpec]:
    """The runs `ids` of the sweep in `folder`, as its sweep.json plans them."""
    record = read_record(folder)
    if record is None:
        raise MinitfmError(f"{quote(str(folder))} holds no sweep (no readable sweep.json): "
                           f"give a sweep folder that minitfm sweep made")
    grid = Grid(record["grid"]["config"], [(k, list(v)) for k, v in record["grid"]["swept"]],
                list(record["grid"]["fixed"]))
    runs, _ = plan_runs(grid, threads, skip_invalid=True)
    by_id = {spec.id: spec for spec in runs}
    unknown = [run_id for run_id in ids if run_id not in by_id]
    if unknown:
        raise MinitfmError(f"{quote(unknown[0])} is no run of the sweep in {quote(str(folder))}"
                           f" (its runs: {', '.join(list(by_id)[:5])}...)")
    specs = [by_id[run_id] for run_id in ids]
    for spec in specs:
        spec.run_dir = folder / spec.id
    return specs


def run_stack_job(specs: list[RunSpec], samples: int, ranges: list[tuple[int, int]],
                  instruments: Callable[[], list], say: Callable[[str], None],
                  claim=None) -> list[str]:
    """Train the runs of `specs` that have not ended as one stack (several in turn when the
    device holds fewer), then write every missing evaluation; the ids of runs that failed.
    `claim`: this process's threads (`run.threads.ThreadClaim`)."""
    from minitfm.run.stack import StackMember, train_stack

    training = [spec for spec in specs if run_status(spec.run_dir) not in DONE]
    for part in fitting(training):
        train_stack([StackMember(spec.cfg, spec.run_dir) for spec in part], instruments, say,
                    claim)
    failed = [spec.id for spec in specs if run_status(spec.run_dir) not in DONE]
    evaluate_stack([spec for spec in specs if spec.id not in failed], samples, ranges,
                   retrained={spec.id for spec in training})
    return failed


def fitting(specs: list[RunSpec]) -> list[list[RunSpec]]:
    """`specs` in stacks that fit the device they train on: on a GPU its free memory (the
    host's is checked as each stack starts); a run that alone does not fit is refused."""
    if not specs or not on_gpu(specs[0].cfg.device):
        return [specs] if specs else []
    from minitfm.run.devices import pick_device

    device = pick_device(specs[0].cfg.device)
    check_fits(training_parts(specs[0].cfg), "training", device)  # one run alone must fit
    per_run = sum(size for _, _, size in training_parts(specs[0].cfg))
    size = max(1, gpu_free_bytes(device) // per_run)
    return [specs[i:i + size] for i in range(0, len(specs), size)]


def evaluate_stack(specs: list[RunSpec], samples: int, ranges: list[tuple[int, int]],
                   retrained: set[str]) -> None:
    """Each run's evaluations of its last.pt (`minitfm eval RUN --checkpoint last --json` per
    range), those missing or of a run trained just now, every run decoded together."""
    from minitfm.fast.stack import evaluate_rows
    from minitfm.lab.curves import read_eval
    from minitfm.lab.loaded import read_checkpoint
    from minitfm.lab.measure.evaluate import held_out, report
    from minitfm.lab.options import EvalOptions

    due = {spec.id: [(lo, hi) for lo, hi in eval_ranges(spec, ranges)
                     if spec.id in retrained or read_eval(eval_path(spec, lo, hi)) is None]
           for spec in specs}
    specs = [spec for spec in specs if due[spec.id]]
    if not specs:
        return
    loaded = [read_checkpoint(spec.run_dir / "checkpoints" / "last.pt") for spec in specs]
    stack = stack_of(loaded)
    for lo, hi in dict.fromkeys(r for spec in specs for r in due[spec.id]):
        rows = [i for i, spec in enumerate(specs) if (lo, hi) in due[spec.id]]
        pairs = [held_out(loaded[i], EvalOptions(samples, lo, hi)) for i in rows]
        results = evaluate_rows(stack, rows, [loaded[i].task for i in rows], pairs,
                                loaded[0].device)
        for i, run_pairs, result in zip(rows, pairs, results):
            text = to_json(report(loaded[i], run_pairs, result)) + "\n"
            write_atomic(eval_path(specs[i], lo, hi), text.encode("utf-8"))


def stack_of(loaded: list) -> object:
    """The loaded runs' models as one `Stack` on their device."""
    from minitfm.book.model import Seq2SeqTransformer
    from minitfm.fast.stack import Stack

    first = loaded[0]
    base = Seq2SeqTransformer(first.config.model, len(first.task.vocab),
                              first.task.vocab.pad_id).to(first.device)
    return Stack([run.model for run in loaded], base)
