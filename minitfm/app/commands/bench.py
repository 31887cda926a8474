"""`minitfm bench`: training throughput against nn.Transformer, MFU, decoding, memory and the
time to solve, measured (`lab/measure/bench.py`) and drawn as tables (`bench_tables`)."""

from __future__ import annotations

import os

import typer
from rich.table import Table

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads
from minitfm.app.output import show, warn
from minitfm.app.parameters import json_option, threads_option
from minitfm.run.files import to_json


@clean_errors
def bench(
    as_json: bool = json_option("Print JSON instead of tables."),
    quick: bool = typer.Option(False, "--quick", help="Fewer repetitions, default size only "
                               "(seconds; for tests and a first look)."),
    solve: bool = typer.Option(False, "--solve", help="Also train the default config from "
                               "scratch: wall seconds and steps to 99% exact match, against "
                               "plain nn.Transformer and x-transformers trainers."),
    compile_: bool = typer.Option(False, "--compile", help="Add torch.compile variants."),
    stacks: str | None = typer.Option(None, "--stacks", metavar="K,K,...", help="Also runs a "
                                      "minute of whole default sweeps of K seeds stacked (1: "
                                      "alone), e.g. 1,16,64,256 on a GPU."),
    device: str = typer.Option("auto", metavar="DEVICE", help="auto, cpu, cuda or cuda:N."),
    threads: str = threads_option(),
) -> None:
    """Measure training throughput against nn.Transformer, MFU, decoding, memory, time to solve."""
    from minitfm.config import check_device
    from minitfm.lab.options import stack_sizes
    from minitfm.run.threads import cores

    check_device(device)
    sizes = stack_sizes(stacks)  # refused before any measuring, or any warning
    load = {"load_average": os.getloadavg()[0], "cores": cores()}
    if load["load_average"] > load["cores"]:
        warn(f"load average {load['load_average']:.1f} on {load['cores']} cores: other work "
             f"is running, so these figures are not meaningful")
    with claimed_threads(threads):
        from minitfm.lab.measure.bench import run_bench

        report = {**load, **run_bench(quick=quick, solve=solve, compile_=compile_,
                                      device=device, stacks=sizes)}
    if as_json:
        print(to_json(report))
    else:
        for table in bench_tables(report):
            show(table)


def bench_tables(report: dict) -> list[Table]:
    """The tables of a bench report: training throughput, greedy decoding, end to end, and
    with --solve the time to solve against the plain reference trainers."""
    tables = [throughput_table(report), decoding_table(report), end_to_end_table(report)]
    tables += [stacks_table(report)] if report.get("stacks") else []
    return tables + ([solve_table(report)] if "solve_reference" in report else [])


def stacks_table(report: dict) -> Table:
    """Whole sweeps of the default config, K seeds as one stack, against one at a time (K=1)."""
    table = Table(title=f"sweeps of the default config, stacked · {report['device']}")
    for col in ("runs", "whole sweep", "runs a minute", "against one at a time", "ended"):
        table.add_column(col, justify="right")
    for row in report["stacks"]:
        ratio = f"{row['against_one_at_a_time']:.2f}x" if row["against_one_at_a_time"] else "-"
        table.add_row(str(row["runs"]), f"{row['wall_s']:.1f} s",
                      f"{row['runs_per_minute']:.1f}", ratio, f"{row['ended']}/{row['runs']}")
    return table


def throughput_table(report: dict) -> Table:
    """Training tokens per second against nn.Transformer, and MFU, per setup; and the book's own
    code (model.code=book) as a share of the fast code's speed."""
    load = (f" · load {report['load_average']:.1f} on {report['cores']} cores"
            if "load_average" in report else "")
    threads = f"{report['threads']} thread{'s' if report['threads'] != 1 else ''}"
    title = (f"minitfm bench · {report['device']} · {threads}{load} · torch "
             f"{report['torch']} · matmul peak {report['peak_flops_per_s'] / 1e9:.1f} GFLOP/s"
             f"{' (bfloat16)' if report.get('peak_dtype') == 'bfloat16' else ''}")
    train = Table(title=title)
    for col in ("setup", "minitfm tok/s", "nn.Transformer tok/s", "ratio", "MFU",
                "book code tok/s"):
        train.add_column(col, justify="right")
    for row in report["throughput"]:
        train.add_row(row["setup"], f"{row['minitfm_tokens_per_s']:,.0f}",
                      f"{row['torch_tokens_per_s']:,.0f}", f"{row['ratio']:.2f}x",
                      f"{row['mfu']:.1%}",
                      f"{row['book_tokens_per_s']:,.0f} ({row['book_ratio']:.2f}x)")
    return train


def decoding_table(report: dict) -> Table:
    """Greedy decoding with and without the KV cache."""
    decode = Table(title="greedy decoding")
    for col in ("length", "sequences", "tokens decoded", "KV cache", "no cache", "speed-up"):
        decode.add_column(col, justify="right")
    for row in report["decoding"]:
        decode.add_row(str(row["length"]), str(row["sequences"]), str(row["decoded_len"]),
                       f"{row['cached_s']:.3f} s",
                       f"{row['uncached_s']:.3f} s", f"{row['speedup']:.1f}x")
    return decode


def end_to_end_table(report: dict) -> Table:
    """Evaluation time, peak memory, and the default config's time to solve."""
    other = Table(title="end to end", show_header=False)
    other.add_row("eval of 1000 sequences (default)", f"{report['eval']['seconds']:.2f} s")
    runs = report.get("solve") or [report["memory"]]
    peaks = [run["peak_rss_mb"] for run in runs if run["peak_rss_mb"]]  # None: no /proc
    other.add_row("peak RSS of a training run", f"{max(peaks):.0f} MB" if peaks else "n/a")
    if "solve_reference" in report:  # the runs are in the solve table
        return other
    for run in report.get("solve", []):
        solved = run["steps_to_99"]
        steps = (f"solved at step {solved}" if solved
                 else f"not solved ({run['exact_match']:.1%} at step {run['steps']})")
        other.add_row(f"default config, seed {run['seed']}: whole process",
                      f"{run['wall_s']:.1f} s, {steps}")
    return other


def solve_table(report: dict) -> Table:
    """Time to solve the default config, whole process: minitfm and each plain reference
    trainer (same size and recipe), seed by seed, and how much faster minitfm is."""
    seeds = ", ".join(str(run["seed"]) for run in report["solve"])
    table = Table(title=f"time to solve the default config (whole process, seeds {seeds})")
    for col in ("trainer", "wall s", "steps to target", "final exact match", "vs minitfm"):
        table.add_column(col, justify="left" if col == "trainer" else "right")
    rows = {"minitfm": {"runs": [{**run, "steps_to_target": run["steps_to_99"]}
                                 for run in report["solve"]]},
            **report["solve_reference"]}
    for trainer, row in rows.items():
        if "skipped" in row:
            table.add_row(trainer, f"skipped: {row['skipped']}", "", "", "")
            continue
        runs = row["runs"]
        ratio = row.get("ratio")
        table.add_row(trainer, " / ".join(f"{run['wall_s']:.1f}" for run in runs),
                      " / ".join(str(run["steps_to_target"] or "-") for run in runs),
                      " / ".join(f"{run['exact_match']:.1%}" for run in runs),
                      "" if ratio is None else faster(ratio))
    return table


def faster(ratio: float) -> str:
    """A reference's time over minitfm's, in words."""
    if ratio >= 1:
        return f"minitfm is {ratio:.1f}x faster"
    return f"minitfm is {1 / ratio:.1f}x slower"
