"""`minitfm explain`: what each head does, its role card in a table (`roles_table`) and a PNG,
and the logit lens (`lens_table`); the lab's `interpret/explain.py` measures, this prints."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from minitfm.app.exit_codes import clean_errors
from minitfm.app.loading import claimed_threads, loaded_run
from minitfm.app.output import show, wrote
from minitfm.app.parameters import (
    book_option,
    checkpoint_option,
    json_option,
    option,
    options_from,
    run_argument,
    threads_option,
)
from minitfm.app.text import printable
from minitfm.errors import shown_path
from minitfm.lab.options import ExplainOptions
from minitfm.run.files import to_json

EFFECT_STYLES = {"essential": "bold red", "helps": "yellow", "minor": "", "negligible": "dim"}


@clean_errors
def explain(
    run: Path | None = run_argument(),
    samples: int = option(ExplainOptions, "samples"),
    checkpoint: str = checkpoint_option(),
    out: Path | None = option(ExplainOptions, "out"),
    force: bool = option(ExplainOptions, "force"),
    as_json: bool = json_option("Print one JSON object instead of the table."),
    threads: str = threads_option(),
    book: Path | None = book_option(),
) -> None:
    """What each head does: its attention pattern, what switching it off costs, its share in
    restoring an answer under patching, and its role in words; a PNG of role cards."""
    options = options_from(ExplainOptions, locals())
    with claimed_threads(threads):
        from minitfm.lab.interpret.explain import explain as explain_run

        loaded = loaded_run(run, checkpoint, book)
        with loaded.running(as_json):
            report = explain_run(loaded, options)
    if as_json:
        print(to_json(report.as_dict()))
        return
    show(Text(printable(f"{report.task} · {shown_path(report.checkpoint)} · step {report.step}"
                        f" · exact match {report.exact_match:.1%} on {report.samples} held-out "
                        f"sequences")))
    show(roles_table(report))
    together = max(report.negligible_together.values(), default=None)
    show(Text("no head is negligible (none costs at most 1 point alone)" if together is None
              else f"every negligible head off at once: exact match falls {100 * together:.1f} "
                   f"points"))
    show(Text(most_needed(report.cards)))
    show(Text("fit: the alignment score of the pattern named (for unclear or diffuse heads, of "
              "the family's best, in brackets); drops: exact match lost with the head alone off, "
              "in points, 95% interval; patched: share of the clean answer's logit difference "
              "the head restores, over 200 resampled held-out pairs (a head whose output is the "
              "same for both inputs of a pair restores nothing, however much it is needed)"))
    show(lens_table(report.lens))
    wrote(report.png)


def most_needed(cards) -> str:
    """The head whose removal costs most, and those whose interval overlaps its own."""
    ranked = sorted(cards, key=lambda card: card.drop, reverse=True)
    top = ranked[0]
    drop, mode = top.drop
    low = top.drops[mode].low
    tied = [card.label for card in ranked[1:] if card.drops[mode].high >= low]
    also = f"; within its interval: {', '.join(tied)}" if tied else ""
    return f"most needed: {top.label} ({100 * drop:.1f} points, {mode} ablation){also}"


def lens_table(lens: dict) -> Table:
    """The logit lens: per decoder layer, the token it would write at each step and its
    probability; the last layer's is the model's own output."""
    table = Table(title=f"logit lens of {lens['input']}: what each decoder layer would write")
    table.add_column("layer")
    for step, token in enumerate(lens["written"]):
        table.add_column(printable(f"{step}: {token}"), justify="right")
    for layer, steps in enumerate(lens["layers"]):
        table.add_row(f"L{layer}", *(printable(f"{s['token']} {s['p']:.2f}") for s in steps))
    return table


def roles_table(report) -> Table:
    """A row per head: pattern and its score, the drops with their intervals, the share."""
    table = Table(title="role cards")
    for name, justify in (("head", "left"), ("pattern", "left"), ("fit", "right"),
                          ("effect", "left"), ("drop zero", "right"), ("drop mean", "right"),
                          ("patched", "right"), ("role", "left")):
        table.add_column(name, justify=justify)
    for card in report.cards:
        p = card.pattern
        named = p.pattern if p.pattern == p.best_fit else f"{p.pattern} ({p.best_fit})"
        drops = [f"{100 * d.value:.1f} [{100 * d.low:.1f}, {100 * d.high:.1f}]"
                 for d in (card.drops["zero"], card.drops["mean"])]
        table.add_row(card.label, named, f"{p.score:.2f}",
                      Text(card.effect, style=EFFECT_STYLES[card.effect]), *drops,
                      f"{card.restored:.2f}", card.sentence)
    return table
