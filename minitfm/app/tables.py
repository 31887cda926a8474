"""What the commands draw in the terminal: a function per table or heatmap, from the data the
library returns (report dicts, dataclasses, lists of rows).

This is the only module besides the CLI and the progress display that knows `rich`: the
library computes, the face draws. The lab modules import torch, so their names are imported
inside the functions that need them, and `minitfm runs` or `minitfm sweep` never pay for it.
"""

from __future__ import annotations

import shlex
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich import box
from rich.columns import Columns
from rich.table import Table
from rich.text import Text

from minitfm.errors import shown_path
from minitfm.run.files import name_text

if TYPE_CHECKING:
    import numpy as np

    from minitfm.lab.look.ablate import AblationReport
    from minitfm.lab.look.over_training import OverTrainingReport
    from minitfm.lab.look.probe import MapBlock
    from minitfm.lab.look.visualize import AttentionReport

SHADES = (" ", "·", "░", "░", "▒", "▒", "▓", "▓", "█")  # the palette's levels without colour


# --- text from users and files: never a character that drives or reorders the terminal ---

# Unicode categories never printed raw: control characters (Cc: ESC, newline, ...), format
# characters (Cf: bidi overrides such as U+202E, zero-width ones) and the line and paragraph
# separators (Zl, Zp). Each is written as Python's repr writes it: \x1b, \n, \u202e.
UNPRINTED = ("Cc", "Cf", "Zl", "Zp")


def unprinted(ch: str) -> bool:
    """Whether `ch` is escaped before it reaches a terminal (see UNPRINTED)."""
    return unicodedata.category(ch) in UNPRINTED


def printable(text: str) -> str:
    """`text` with the UNPRINTED characters escaped, so that a file name or a model's output can
    neither drive the terminal, nor break a line, nor show reordered; the bytes of a name that
    are not UTF-8 as `\\xe9` (`files.name_text`), which any terminal can show."""
    return "".join(repr(ch)[1:-1] if unprinted(ch) else ch for ch in name_text(text))


def shell_quote(text: str) -> str:
    """`text` as one shell word to paste: shlex's quoting, or bash's `$'...'` with escapes
    when it holds UNPRINTED characters (shlex would leave them raw inside its quotes)."""
    if printable(text) == text:
        return shlex.quote(text)
    return "$'" + "".join(map(ansi_c, text)) + "'"


def ansi_c(ch: str) -> str:
    """One character inside bash's `$'...'`: UNPRINTED ones, `\\` and `'` escaped."""
    if ch in "\\'":
        return "\\" + ch
    if unprinted(ch):  # bash reads \xHH, \uHHHH and \UHHHHHHHH
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code < 0x10000 \
            else f"\\U{code:08x}"
    return name_text(ch)  # a byte that is not UTF-8: `\\xe9` makes it again


def heading_lines(title: str, width: int) -> list[str]:
    """`a · b · c` broken at its ` · ` separators into lines of at most `width` where it can:
    `matmul peak 60.9 GFLOP/s` stays in one piece."""
    lines: list[str] = []
    for item in filter(None, title.split(" · ")):
        if lines and len(lines[-1]) + 3 + len(item) <= width:
            lines[-1] += " · " + item
        else:
            lines.append(item)
    return lines

# --- `minitfm eval` ---

def per_length_table(report: dict) -> Table:
    """A row per length (count, exact match, token accuracy) and the totals."""
    lo, hi = report["trained_lengths"]
    where = shown_path(report["checkpoint"])
    table = Table(title=f"{report['task']} · {where} · step {report['step']}")
    for column in ("length", "count", "exact match", "token accuracy"):
        table.add_column(column, justify="right")
    for length, row in report["per_length"].items():
        outside = not lo <= int(length) <= hi
        table.add_row(f"{length}{' *' if outside else ''}", str(row["count"]),
                      f"{row['exact_match']:.1%}", f"{row['token_accuracy']:.1%}",
                      style="yellow" if outside else None)
    table.add_section()
    table.add_row("all", str(report["samples"]), f"{report['exact_match']:.1%}",
                  f"{report['token_accuracy']:.1%}", style="bold")
    table.caption = (f"teacher-forced loss {report['loss']:.4f}; trained on lengths {lo}..{hi}"
                     + ("; * outside the trained range" if any(
                         not lo <= int(n) <= hi for n in report["per_length"]) else "")
                     + (f"; {report['unknown_symbols']} symbols never trained on, read as <unk>"
                        if report.get("unknown_symbols") else ""))
    return table


# --- `minitfm visualize-attention` ---

def attention_text(report: AttentionReport, terminal: bool, width: int,
                   widest: Callable[[Any], int]) -> list:
    """What `visualize-attention` prints before the PNG's path, in order: plain lines (str:
    heading, input, prediction, expected) and renderables (the terminal heatmaps when asked for
    and when they fit `width`, which `widest` measures; their legend; the alignment table)."""
    heading = f"{report.task.name} · {shown_path(report.checkpoint)} · step {report.step}"
    out: list = [*heading_lines(printable(heading), width), *probe_lines(report)]
    maps = attention_heatmaps(report.terminal_blocks) if terminal else []
    needed = max(map(widest, maps), default=0)
    if needed > width:  # wrapped, a map's rows would fall apart
        out.append(f"(the terminal heatmaps need {needed} columns, this terminal has {width}: "
                   f"see the PNG, or widen the terminal)")
    elif terminal:
        out += [*maps, heatmap_legend(report.terminal_blocks)]
        if len(report.terminal_blocks) < len(report.blocks):
            out.append("(terminal: cross-attention only; --kind encoder|decoder or --layer/"
                       "--head for the others, all of them are in the PNG)")
    return [*out, alignment_table(report)]


def probe_lines(report: AttentionReport) -> list[str]:
    """The input, the prediction (right or wrong) and the expected output, a line each."""
    fmt, probe = report.task.format, report.probe
    lines = [f"input:      {printable(fmt(probe.src))}"]
    if report.target is None:  # pairs: an input that is not in the data
        return [*lines, f"prediction: {printable(fmt(probe.prediction))}",
                "expected:   (unknown: this input is not a held-out pair)"]
    verdict = "correct" if probe.prediction == report.target else "wrong"
    return [*lines, f"prediction: {printable(fmt(probe.prediction))}  ({verdict})",
            f"expected:   {printable(fmt(report.target))}"]


# --- `minitfm visualize-attention`: terminal heatmaps ---

def palette_cells(width: int = 2) -> list[tuple[str, str]]:
    """The palette's coloured blocks; their shade characters show only where colour is off
    (pipes, NO_COLOR)."""
    from minitfm.lab.pictures import PALETTE

    return [(shade * width, f"{colour} on {colour}")
            for shade, colour in zip(SHADES, PALETTE, strict=True)]


def heatmap(weights: np.ndarray, queries: list[str], keys: list[str], title: str) -> Text:
    """One map: a row per query token, a 2-wide cell per key token."""
    from minitfm.lab.look.mapgrid import SHORT_TOKENS
    from minitfm.lab.pictures import level

    cells = palette_cells()
    width = max(len(q) for q in queries)
    header = " " * (width + 1) + "".join(f"{SHORT_TOKENS.get(k, k)[:2]:>2}" for k in keys)
    text = Text()
    text.append(title, style="bold")
    text.append("\n" + header)
    for query, row in zip(queries, weights, strict=True):
        text.append(f"\n{query:>{width}} ")
        for weight in row:
            text.append(*cells[level(float(weight))])
    return text


def heatmap_legend(blocks: list[MapBlock]) -> Text:
    """The palette from weight 0 to 1, and how to read the maps: the rows, the columns, and
    the short names of the column tokens that appear in them (`^ = <bos>`)."""
    from minitfm.lab.look.mapgrid import SHORT_TOKENS

    text = Text("weight 0 ")
    for cell in palette_cells():
        text.append(*cell)
    shown = {key for block in blocks for key in block.keys}
    short = [f"{SHORT_TOKENS[token]} = {token}" for token in SHORT_TOKENS if token in shown]
    rows = "query tokens" if all(b.kind == "encoder" or b.note is None for b in blocks) \
        else "query tokens (decoder: token read → token written)"
    text.append(f" 1  (colour ∝ √weight)\nrows: {rows}, columns: key tokens"
                + "".join(f", {s}" for s in short))
    return text


def attention_heatmaps(blocks: list[MapBlock]) -> list:
    """A heading per kind and layer, then its heads side by side."""
    from minitfm.lab.look.probe import KIND_TITLES

    out = []
    for block in blocks:
        for r, layer in enumerate(block.layers):
            out.append(Text(f"\n{KIND_TITLES[block.kind]} · layer {layer}", style="bold cyan"))
            maps = [heatmap(block.weights[r, c], block.queries, block.keys, f"head {head}")
                    for c, head in enumerate(block.heads)]
            out.append(Columns(maps, padding=(1, 3)))
    return out


def alignment_table(report: AttentionReport) -> Table | Text:
    """Every cross-attention head's alignment score, the best head in bold."""
    import numpy as np

    from minitfm.lab.look.probe import ALIGNMENT_SAMPLES

    if report.scores is None:
        return Text(f"task '{report.task.name}' has no ideal alignment: no alignment score")
    best = divmod(int(report.held_out_scores.argmax()), report.held_out_scores.size(1))
    table = Table(title="alignment score of each cross-attention head")
    held_out = f"held-out ({ALIGNMENT_SAMPLES})"
    for column in ("layer", "head", "this input", held_out, "held-out argmax"):
        table.add_column(column, justify="right")
    table.add_column("")
    for layer, head in np.ndindex(*report.scores.shape):
        is_best = (layer, head) == best
        table.add_row(str(layer), str(head), f"{report.scores[layer, head]:.3f}",
                      f"{report.held_out_scores[layer, head]:.3f}",
                      f"{report.held_out_hits[layer, head]:.3f}", "← best" if is_best else "",
                      style="bold green" if is_best else None)
    table.caption = ("weight on the ideal source position, mean over target positions (EOS "
                     "excluded), teacher-forced on the true target: 1 = exact, about 1/S = "
                     f"uniform; held-out argmax: share of the target positions of the same "
                     f"{ALIGNMENT_SAMPLES} held-out pairs whose strongest key is the ideal one")
    return table


def over_training_table(report: OverTrainingReport) -> Table:
    """A row per recorded step: its exact match and each cross-attention head's scores."""
    from minitfm.lab.look.over_training import head_text
    from minitfm.lab.look.probe import ALIGNMENT_SAMPLES

    timeline, layer = report.timeline, report.layer
    aligned = timeline.alignment is not None
    scores = "alignment score · entropy" if aligned else "entropy"
    table = Table(title=f"{scores} of each cross-attention head of {report.why}")
    for column in ("step", "exact match", *(f"head {h}" for h in range(timeline.cross.shape[2]))):
        table.add_column(column, justify="right")
    for n, step in enumerate(timeline.steps):
        em = timeline.exact_match[n]
        heads = [head_text(timeline, n, layer, h, labelled=False)
                 for h in range(timeline.cross.shape[2])]
        table.add_row(str(step), "" if em is None else f"{em:.1%}", *heads)
    table.caption = (f"on {ALIGNMENT_SAMPLES} held-out pairs; entropy in nats (uniform over S "
                     f"source tokens: ln S; one token: 0)"
                     + ("; alignment: weight on the ideal source position" if aligned else ""))
    return table


# --- `minitfm ablate` ---

def ablation_tables(report: AblationReport) -> list:
    """The headline, a table per kind (rows layers, columns heads and the whole layer), a key."""
    from minitfm.lab.look.ablate import MARKED_DROP, grid, headline
    from minitfm.lab.look.probe import KIND_TITLES, KINDS

    lines = headline(report, shown_path(report.checkpoint)).split("\n")  # escaped one by one
    out: list = [Text("\n".join(printable(line) for line in lines))]
    for kind in KINDS:
        rows = grid(report, kind)
        table = Table(title=KIND_TITLES[kind])
        table.add_column("layer", justify="right")
        for head in range(len(rows[0]) - 1):
            table.add_column(f"head {head}", justify="right")
        table.add_column("all heads", justify="right")
        for layer, row in enumerate(rows):
            table.add_row(str(layer), *(ablation_cell(cell) for cell in row))
        out.append(table)
    out.append(Text(f"cells: exact match with the head (or all heads of the layer) off, and "
                    f"its change in points; * = a drop of more than {100 * MARKED_DROP:.0f} "
                    f"points"))
    return out


def ablation_cell(row: dict) -> Text:
    """`12.4% (-87.4) *`: exact match, change in points, and the mark of a head that matters."""
    from minitfm.lab.look.ablate import MARKED_DROP

    marked = row["drop"] > MARKED_DROP
    return Text(f"{row['exact_match']:.1%} ({-100 * row['drop']:+.1f}){' *' if marked else '  '}",
                style="bold red" if marked else "")


# --- `minitfm tasks` ---

def tasks_table() -> Table:
    """Every registered task with what it learns and an example."""
    from minitfm.tasks import TASKS

    table = Table(title="tasks (task.name)")
    for column in ("name", "what it learns", "example input", "target"):
        table.add_column(column)
    for name, cls in TASKS.items():
        example_in, example_out = cls.catalog_example()
        table.add_row(name, cls.summary, example_in, example_out)
    return table


# --- `minitfm learn` ---

def grades_table(grades: list) -> Table:
    """`minitfm learn check`: each exercise's status, in the book's order."""
    table = Table(title="minitfm learn check")
    for column in ("#", "exercise", "file", "status"):
        table.add_column(column)
    marks = {"passed": "passed", "failed": "FAILED", "not started": "not started"}
    for grade in grades:
        table.add_row(str(grade.number), grade.exercise.name, grade.exercise.file,
                      marks[grade.status])
    return table


def zoo_table(results: list) -> Table:
    """`minitfm learn check` on a bug zoo: each planted bug's symptom, fixed or not."""
    table = Table(title="minitfm learn check: the bug zoo")
    for column in ("#", "symptom", "fixed"):
        table.add_column(column)
    for number, (bug, fixed) in enumerate(results, 1):  # once fixed, what the mistake was
        table.add_row(str(number), bug.symptom, f"fixed: {bug.mistake}" if fixed else "not yet")
    return table


# --- `minitfm bench` ---

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


# --- `minitfm sweep` and `minitfm runs` ---

def sweep_table(rows: list[dict[str, Any]], keys: list[str], title: str) -> Table:
    """Rows = configurations (`#` as `minitfm compare` takes it): n, then each figure's mean ±
    the half-width of its 95% interval over the seeds (`lab/many/seeds.py`)."""
    from minitfm.lab.many.results import by_configuration, range_labels
    from minitfm.lab.many.runs import short_names
    from minitfm.lab.many.seeds import CAPTION, configuration_rows

    names, spans = short_names(keys), range_labels(rows)
    shown = [key for key in keys if key != "seed"]
    summaries = configuration_rows(by_configuration(rows), keys, spans)
    target = any("success_rate mean" in row for row in summaries)
    to = " to target" if target else ""
    table = Table(title=title, caption=CAPTION)
    for column in ["#", *(names[k] for k in shown), "n", *(f"exact match {s}" for s in spans),
                   *(["at target"] if target else []), f"steps{to}", f"seconds{to}"]:
        table.add_column(column, justify="left" if column in names.values() else "right")
    for row in summaries:
        cells = [str(row["#"]), *(printable(str(row[k])) if row[k] is not None else "null"
                                  for k in shown)]
        cells.append(str(row["n"]) if row["n"] == row["runs"] else f"{row['n']} of {row['runs']}")
        cells += [plus_minus(row, f"exact_match {s}", "{:.1%}") for s in spans]
        if target:
            cells.append(rate_cell(row))
        for name, form in (("steps", "{:.0f}"), ("seconds", "{:.1f}")):
            middle = row[f"{name} median"]
            cells.append(plus_minus(row, name, form) + ("" if middle is None or row["n"] < 2
                                                       else f"\nmedian {form.format(middle)}"))
        table.add_row(*cells)
    return table


def plus_minus(row: dict[str, Any], name: str, form: str) -> str:
    """`97.3% ± 1.2%`: the mean ± the half-width of its interval (a value alone: one run)."""
    centre, lo, hi = (row.get(f"{name} {end}") for end in ("mean", "lo", "hi"))
    if centre is None:
        return "-"
    if lo is None:
        return form.format(centre)
    return f"{form.format(centre)} ± {form.format((hi - lo) / 2)}"


def rate_cell(row: dict[str, Any]) -> str:
    """`7/8` over its Wilson interval `47-100%`."""
    if row.get("success_rate mean") is None:
        return "-"
    return (f"{row['reached']}/{row['n']}\n{row['success_rate lo']:.0%}-"
            f"{row['success_rate hi']:.0%}")


def runs_table(rows: list[dict[str, Any]], title: str) -> Table:
    """The rows of `runs.list_runs`: a run's name with its changes, task, steps, best, status.
    Every cell is text as read from the run's files, control characters escaped."""
    # No vertical lines, and each run's changes under its name: the columns fit 80 cells.
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in ("run: changes from the defaults", "task", "steps", "best exact match",
                   "wall s", "status"):
        # folded, never cut: a change shown as "model.positiona…" says nothing
        table.add_column(column, justify="right" if column in ("steps", "wall s") else "left",
                         overflow="fold", no_wrap=column in ("steps", "wall s", "status"),
                         max_width=10 if column == "best exact match" else None)
    for row in rows:
        best = row["best_exact_match"]
        changes = "".join(f"\n  {printable(f'{key}={value}')}"
                          for key, value in row["changes"].items()
                          if key != "task.name")  # the task has its own column
        table.add_row(Text(printable(row["name"]), style="bold") + Text(changes),
                      Text("?" if row["task"] is None else printable(str(row["task"]))),
                      str(row["step"]), "-" if best is None else f"{best:.1%}",
                      "-" if row["wall_s"] is None else f"{row['wall_s']:.1f}", row["status"])
    return table
