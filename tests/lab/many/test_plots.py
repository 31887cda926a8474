"""`minitfm plot` (training curves of runs) and `minitfm eval --plot` (exact match per length)."""

import json
import os
import struct

import pytest
from matplotlib.colors import to_hex

from minitfm.config import load_config, to_yaml
from minitfm.errors import shown_path
from minitfm.lab.curves import run_curves
from minitfm.lab.many.plots import curves_figure, run_labels
from minitfm.lab.measure.evaluate import BEYOND, TRAINED, length_figure
from minitfm.lab.pictures import is_minitfm_picture
from tests.helpers import TINY, assert_clean_error, run_cli
from tests.helpers import train_bare as train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SHORT = [*TINY, "train.steps=40", "train.eval_every=20", "train.target_exact_match=null",
         "log.tensorboard=false"]


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()[:24]
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs that differ in seed and positions, and a third like the first."""
    root = tmp_path_factory.mktemp("plots")
    settings = {"a": ["seed=0"], "b": ["seed=1", "model.positional=rope"], "c": ["seed=0"]}
    for name, extra in settings.items():
        train(load_config(None, [*SHORT, *extra]), run_dir=root / name)
    return root


def test_curves_are_read_per_step_from_metrics_jsonl(runs):
    curves = run_curves(runs / "a")
    assert [r["step"] for r in curves["train"]] == [10, 20, 30, 40]
    assert [r["step"] for r in curves["eval"]] == [20, 40]
    assert all(0.0 <= r["exact_match"] <= 1.0 for r in curves["eval"])


def test_a_resumed_runs_repeated_steps_count_once(runs, tmp_path):
    run_dir = tmp_path / "resumed"
    run_dir.mkdir()
    lines = (runs / "a" / "metrics.jsonl").read_text().splitlines()
    again = {**json.loads(lines[-1]), "exact_match": 0.5}  # the last eval, written again
    (run_dir / "metrics.jsonl").write_text("\n".join([*lines, json.dumps(again)]) + "\n")
    evals = run_curves(run_dir)["eval"]
    assert [r["step"] for r in evals] == [20, 40] and evals[-1]["exact_match"] == 0.5


def test_runs_are_labelled_by_the_keys_that_differ(runs):
    assert run_labels([runs / "a", runs / "b"]) == ["seed=0, positional=sinusoidal",
                                                    "seed=1, positional=rope"]
    assert run_labels([runs / "a"]) == ["a"]  # one run: its name
    assert run_labels([runs / "a", runs / "c"]) == ["a", "c"]  # nothing differs: the names
    assert run_labels([runs / "a", runs / "b", runs / "c"]) == [
        "seed=0, positional=sinusoidal (a)", "seed=1, positional=rope (b)",
        "seed=0, positional=sinusoidal (c)"]  # a label two runs share: with the names


def test_curves_figure_has_loss_and_exact_match_with_a_legend_of_runs(runs):
    labels = ["seed=0", "seed=1"]
    fig = curves_figure([run_curves(runs / "a"), run_curves(runs / "b")], labels)
    loss, exact = fig.get_axes()
    assert loss.get_yscale() == "log" and len(loss.get_lines()) == 4  # train + eval per run
    assert [t.get_text() for t in exact.get_legend().get_texts()] == labels
    assert [line.get_xdata().tolist() for line in exact.get_lines()] == [[20, 40], [20, 40]]


def test_cli_plots_one_run_into_its_directory(runs):
    (runs / "a" / "plot.png").unlink(missing_ok=True)
    result = run_cli("plot", runs / "a")
    assert result.exit_code == 0, result.stderr
    png = runs / "a" / "plot.png"
    assert result.stdout.strip() == f"wrote {shown_path(png)}"
    assert is_minitfm_picture(png) and png_size(png) == (1100, 450)
    os.utime(png, ns=(0, 0))  # dated 1970: a rewritten file bears a later date
    again = run_cli("plot", runs / "a" / "checkpoints" / "last.pt")  # a checkpoint: its run
    assert again.exit_code == 0, again.stderr  # its own earlier plot is replaced unasked
    assert again.stdout.strip() == f"wrote {shown_path(png)}"
    assert png.stat().st_mtime_ns != 0 and is_minitfm_picture(png) and png_size(png) == (1100, 450)


def test_cli_overlays_several_runs_beside_them_not_in_the_current_directory(runs, tmp_path,
                                                                           monkeypatch):
    here = tmp_path / "checkout"  # a clone's root: a comparison must not litter it
    here.mkdir()
    monkeypatch.chdir(here)
    result = run_cli("plot", runs / "a", runs / "b")
    assert result.exit_code == 0, result.stderr
    png = runs / "plot.png"  # in the folder holding the first run (in a clone: ./runs, ignored)
    assert result.stdout.strip() == f"wrote {shown_path(png)}" and is_minitfm_picture(png)
    assert list(here.iterdir()) == []


def test_cli_never_replaces_a_file_it_did_not_write_unless_forced(runs, tmp_path):
    mine = tmp_path / "mine.png"
    mine.write_bytes(PNG_MAGIC + b"a user's picture")
    result = run_cli("plot", runs / "a", "--out", mine)
    assert_clean_error(result, 2, f"--out ('{mine}') exists and is not a picture minitfm "
                                  f"wrote", "--force")
    assert mine.read_bytes() == PNG_MAGIC + b"a user's picture"
    forced = run_cli("plot", runs / "a", "--out", mine, "--force")
    assert forced.exit_code == 0, forced.stderr
    assert is_minitfm_picture(mine)


@pytest.mark.parametrize("make,args,needles", [
    (None, ["nowhere"], ["run 'nowhere' not found"]),
    ("dir", ["{tmp}"], ["is not a minitfm run directory"]),
    ("pt", ["{tmp}/model.pt"], ["is not inside a minitfm run"]),
    ("config", ["{tmp}/run"], ["has no metrics yet"]),
    (None, ["{runs}/a", "--out", "{tmp}/plot.jpg"], ["--out", "must be a .png file"]),
    ("pngdir", ["{runs}/a", "--out", "{tmp}/maps.png"], ["is a directory"]),
])
def test_cli_errors_are_one_clean_line(runs, tmp_path, make, args, needles):
    if make == "pt":
        (tmp_path / "model.pt").write_bytes(b"not a run")
    elif make == "pngdir":
        (tmp_path / "maps.png").mkdir()
    elif make == "config":  # a run that has not logged anything yet
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.yaml").write_text((runs / "a" / "config.yaml").read_text())
    result = run_cli("plot", *[a.format(tmp=tmp_path, runs=runs) for a in args])
    assert_clean_error(result, 2, *needles)


def test_length_figure_tells_trained_lengths_from_those_beyond():
    per_length = {str(n): {"count": 10, "exact_match": 1.0 if n <= 4 else 0.0,
                           "token_accuracy": 1.0} for n in range(1, 7)}
    report = {"per_length": per_length, "trained_lengths": [1, 4], "task": "copy",
              "checkpoint": "model.pt", "step": 20}
    ax = length_figure(report).get_axes()[0]
    colours = {round(bar.get_x() + bar.get_width() / 2): to_hex(bar.get_facecolor())
               for bar in ax.patches}
    assert colours == {n: to_hex(TRAINED if n <= 4 else BEYOND) for n in range(1, 7)}
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "trained lengths 1..4", "beyond the trained lengths"]
    labels = [t.get_text() for t in ax.texts]  # each bar's value, 0% ones included
    assert labels == ["100%"] * 4 + ["0%"] * 2


@pytest.mark.parametrize("lengths", [1, 6, 32, 64])
def test_length_figures_title_and_labels_lie_inside_the_figure(tmp_path, lengths):
    """The title names the run and checkpoint in full, wrapped, never cut: it used to be centred
    over the axes, narrower than the figure by the legend, and poked out on the left."""
    from matplotlib.text import Text

    from tests.lab.attention.test_viz import texts_outside

    run_dir = tmp_path / "reverse-lengthgen-rope-random-20261125-101010"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(load_config(None, [])))
    per_length = {str(n): {"count": 10, "exact_match": 1.0 if n <= 16 else 0.5,
                           "token_accuracy": 1.0} for n in range(1, lengths + 1)}
    report = {"per_length": per_length, "trained_lengths": [1, 16], "task": "reverse",
              "checkpoint": str(run_dir / "checkpoints" / "best.pt"), "step": 12345}
    fig = length_figure(report)
    assert texts_outside(fig) == []
    shown = " ".join(t.get_text().replace("\n", " ") for t in fig.findobj(Text))
    assert f"reverse · {run_dir.name}/best.pt · step 12345" in shown


def test_eval_plot_writes_the_chart_and_keeps_json_on_stdout(runs, tmp_path):
    png = tmp_path / "lengths.png"
    result = run_cli("eval", runs / "a", "--max-len", "8", "--samples", "100", "--plot", png,
                     "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["trained_lengths"] == [1, 6]
    assert result.stderr.strip() == f"wrote {shown_path(png)}" and is_minitfm_picture(png)


def test_eval_plot_refuses_a_users_file_before_decoding(runs, tmp_path):
    notes = tmp_path / "notes.png"
    notes.write_text("my notes")
    result = run_cli("eval", runs / "a", "--plot", notes)
    assert_clean_error(result, 2, "--plot", "exists and is not a picture minitfm wrote")
    assert notes.read_text() == "my notes"


def test_cli_plot_without_runs_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_clean_error(run_cli("plot"), 2, "no runs")


def test_line_colours_are_colour_blind_safe_and_stand_out_on_white():
    from minitfm.lab.pictures import LINE_COLOURS, line_style

    def luminance(colour: str) -> float:  # WCAG 2 relative luminance
        rgb = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    assert all(1.05 / (luminance(c) + 0.05) >= 3 for c in LINE_COLOURS)  # 3:1, WCAG non-text
    styles = {tuple(sorted(line_style(i).items())) for i in range(24)}
    assert len(styles) == 24  # 24 lines told apart


# --- any metric (--metric) ---

@pytest.fixture(scope="module")
def gauged(tmp_path_factory):
    """Two tiny runs, trained as `minitfm train` trains (gauges every 5 steps: 8 readings,
    evaluations at 20 and 40), that differ in seed only."""
    root = tmp_path_factory.mktemp("gauged")
    for seed in (0, 1):
        result = run_cli("train", *SHORT, f"seed={seed}", "log.gauge_every=5",
                         "--run-dir", root / f"s{seed}")
        assert result.exit_code == 0, result.stderr
    return root


def records(run_dir, split: str, key: str) -> tuple[list[int], list[float]]:
    """The steps and values of `key` in the run's `split` lines, as metrics.jsonl holds them."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    found = [(r["step"], r[key]) for r in lines if r["split"] == split]
    return [step for step, _ in found], [value for _, value in found]


def test_metric_draws_a_gauge_a_curve_per_run_labelled_by_what_differs(gauged):
    from minitfm.lab.many.plots import metric_panels, metrics_figure

    run_dirs = [gauged / "s0", gauged / "s1"]
    curves = [run_curves(run_dir) for run_dir in run_dirs]
    panels = metric_panels(curves, ["align"])
    assert panels == [("gauges", "align")]
    (ax,) = metrics_figure(curves, panels, run_labels(run_dirs)).get_axes()
    assert ax.get_title() == "gauges/align" and ax.get_ylabel() == "align"
    for line, run_dir in zip(ax.get_lines(), run_dirs, strict=True):
        steps, values = records(run_dir, "gauges", "align")
        assert steps == [5, 10, 15, 20, 25, 30, 35, 40]  # 8 readings: a line
        assert line.get_xdata().tolist() == steps and line.get_ydata().tolist() == values
        assert line.get_linestyle() == "-"
    legend = ax.get_figure().legends[0]
    assert [t.get_text() for t in legend.get_texts()] == ["seed=0", "seed=1"]


def test_metric_on_the_command_line_writes_the_picture(gauged):
    png = gauged / "gauges.png"
    result = run_cli("plot", gauged / "s0", gauged / "s1", "--metric", "token_accuracy",
                     "--metric", "gauges/loss", "--out", png)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"wrote {shown_path(png)}" and is_minitfm_picture(png)


def test_a_key_of_several_splits_is_a_panel_each_and_split_key_picks_one(gauged):
    from minitfm.lab.many.plots import metric_panels

    curves = [run_curves(gauged / "s0")]
    assert metric_panels(curves, ["loss"]) == [("train", "loss"), ("eval", "loss"),
                                                ("gauges", "loss")]
    assert metric_panels(curves, ["eval/loss", "exact_match", "loss"]) == [
        ("eval", "loss"), ("eval", "exact_match"), ("train", "loss"), ("gauges", "loss")]


@pytest.mark.parametrize("metric,needles", [
    ("algn", ["--metric 'algn': no run's metrics.jsonl has such a number (did you mean "
              "'align'?)"]),
    ("gauges/exact_match", ["(did you mean 'eval/exact_match'?)"]),
    ("restricted_loss", ["no run's metrics.jsonl has such a number"]),
])
def test_an_unknown_metric_is_one_line_listing_the_runs_keys(gauged, metric, needles):
    result = run_cli("plot", gauged / "s0", gauged / "s1", "--metric", metric)
    assert_clean_error(result, 2, *needles, "train: loss, ", "eval: loss, ",
                       "gauges: exact, loss, token_accuracy, ", "align", "SPLIT/KEY")
    assert not (gauged / "plot.png").exists()


def test_a_run_without_the_metric_is_said_and_left_out(gauged, runs):
    result = run_cli("plot", gauged / "s0", runs / "a", "--metric", "align", "--out",
                     gauged / "mixed.png")
    assert result.exit_code == 0, result.stderr
    assert f"note: run '{runs / 'a'}' has no gauges/align: not drawn" in result.stderr


def test_few_evaluations_are_points_not_lines_joined(gauged, runs):
    from minitfm.lab.many.plots import metric_panels, metrics_figure

    curves = [run_curves(gauged / "s0")]
    panels = metric_panels(curves, ["eval/exact_match", "gauges/exact"])
    evals, gauges = metrics_figure(curves, panels, ["s0"]).get_axes()[:2]
    (points,), (line,) = evals.get_lines(), gauges.get_lines()
    assert points.get_xdata().tolist() == [20, 40]
    assert points.get_linestyle() == "None" and points.get_marker() == "o"  # 2: points
    assert line.get_linestyle() == "-" and len(line.get_xdata()) == 8  # 8 readings: a line
    # the default figure too: 2 evaluations a run, points in both panels
    loss, exact = curves_figure([run_curves(runs / "a")], ["a"]).get_axes()
    train, held_out = loss.get_lines()
    assert train.get_linestyle() == "-" and held_out.get_linestyle() == "None"
    assert [line.get_linestyle() for line in exact.get_lines()] == ["None"]
