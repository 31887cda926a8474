"""Seeds as an axis and `minitfm compare`, on run directories written here (config.yaml,
summary.json, eval-1-6.json as a sweep's jobs leave them): nothing is trained, a few seconds.

Runs that miss the target are counted (a miss in the success rate, the step budget in the
steps), runs that did not end are named and left out; `compare` says "no difference" for two
identical configurations and finds a planted one; bad input is one line, exit 2."""

import csv
import json
from pathlib import Path

import pytest

from minitfm.config import load_config, to_yaml
from minitfm.errors import shown_path
from minitfm.lab.many.grid import RunSpec, parse_seeds
from minitfm.lab.many.results import by_configuration, result_row, write_results
from minitfm.lab.many.seeds import configuration_rows
from tests.helpers import TINY, assert_clean_error, run_cli

BUDGET = 200
POSITIONAL = "model.positional"


def fake_run(folder: Path, name: str, seed: int, steps: int | None, exact: float,
             wall_s: float | None = None, overrides: tuple = ()) -> Path:
    """A run as a sweep's job leaves it: `steps` None is a miss (finished at the budget)."""
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    cfg = load_config(None, [*TINY, f"seed={seed}", f"train.steps={BUDGET}", *overrides])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    reached = steps is not None
    summary = {"status": "stopped at target" if reached else "finished",
               "step": steps if reached else BUDGET, "steps": BUDGET,
               "wall_s": wall_s if wall_s is not None else (steps or BUDGET) / 10,
               "best_exact_match": 0.995 if reached else 0.6, "exact_match": exact}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "eval-1-6.json").write_text(json.dumps({"exact_match": exact, "samples": 200,
                                                       "per_length": {}}))
    return run_dir


def fake_sweep(folder: Path, configurations: dict[str, list[tuple]],
               key: str = POSITIONAL) -> Path:
    """A sweep folder: sweep.json, results.jsonl, and a run per (seed, steps, exact) of each
    configuration (`KEY=VALUE`, `positional=VALUE` unless told)."""
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"grid": {}}))
    rows = []
    for value, runs in configurations.items():
        for seed, steps, exact in runs:
            name = f"{key.rpartition('.')[2]}={value},seed={seed}"
            fake_run(folder, name, seed, steps, exact, overrides=(f"{key}={value}",))
            rows.append({"run": name, "seed": seed, key: value,
                         "configuration": f"{key}={value}"})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def sweep_rows(folder: Path, runs: list[tuple]) -> list[dict]:
    """results.jsonl rows of a configuration of `runs` (seed, steps or None, exact), as
    `result_row` makes them."""
    rows = []
    for seed, steps, exact in runs:
        cfg = load_config(None, [*TINY, f"seed={seed}", f"train.steps={BUDGET}"])
        spec = RunSpec(f"seed={seed}", {"seed": str(seed)}, [], cfg,
                       fake_run(folder, f"seed={seed}", seed, steps, exact))
        rows.append(result_row(spec, []))
    return rows


SAME = [(seed, 100 + 5 * seed, 0.99) for seed in range(8)]


# --- seeds as an axis ---

@pytest.mark.parametrize("text, seeds", [
    ("0..7", "0,1,2,3,4,5,6,7"), ("0..2,7", "0,1,2,7"), (" 3 .. 4 ", "3,4"), ("5", "5"),
    ("0,1,2", "0,1,2"), ("-1..1", "-1,0,1"),
])
def test_seeds_take_ranges_and_lists(text, seeds):
    assert parse_seeds(text) == seeds


def test_a_range_of_seeds_makes_a_run_per_seed_and_configuration(tmp_path):
    result = run_cli("sweep", *TINY, "model.positional=sinusoidal,rope", "--seeds", "0..3",
                     "--out", tmp_path / "sw", "--dry-run")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 8 and sum("seed=3" in line for line in lines) == 2


@pytest.mark.parametrize("seeds, needle", [
    ("3..1", "'3..1' is no range A..B with A <= B"),
    ("0..", "'0..' is no range"),
    ("0..x", "'0..x' is no range"),
    ("0..99999", "'0..99999' is 100,000 seeds, at most 10,000"),
    ("0..3,2", "gives the value '2' twice"),
])
def test_bad_seed_ranges_are_one_line(tmp_path, seeds, needle):
    result = run_cli("sweep", *TINY, "--seeds", seeds, "--out", tmp_path / "sw", "--dry-run")
    assert_clean_error(result, 2, needle)


@pytest.mark.parametrize("args, needles", [
    (["seed=5", "--seeds", "0..1"], ["seed=5 and --seeds 0..1 both set the seed",
                                     "give the seeds once"]),
    (["seed=0,1", "--seeds", "2,3"], ["seed=0,1 and --seeds 2,3 both set the seed"]),
    (["--seeds", "0,1", "--seeds", "2,3"], ["--seeds is given 2 times ('0,1', '2,3')",
                                            "--seeds 0,1,2,3"]),
])
def test_seeds_given_twice_are_refused_not_dropped(tmp_path, args, needles):
    result = run_cli("sweep", *TINY, *args, "--out", tmp_path / "sw", "--dry-run")
    assert_clean_error(result, 2, *needles)
    assert not (tmp_path / "sw").exists()


def test_runs_that_miss_the_target_count_as_misses_and_at_the_budget(tmp_path):
    rows = sweep_rows(tmp_path, [(0, 100, 0.99), (1, 120, 0.99), (2, 140, 0.99),
                                 (3, None, 0.60)])
    assert [row["reached"] for row in rows] == [True, True, True, False]
    (summary,) = configuration_rows(by_configuration(rows), ["seed"], ["1..6"])
    assert summary["n"] == 4 and summary["reached"] == 3
    assert summary["success_rate mean"] == 0.75
    assert (summary["success_rate lo"], summary["success_rate hi"]) == pytest.approx(
        (0.3006, 0.9544), abs=1e-4)  # Wilson, 3 of 4
    assert summary["steps median"] == 130  # 100, 120, 140 and the miss at 200: never dropped
    assert summary["steps mean"] == 140
    assert summary["seconds median"] == 13.0
    assert summary["exact_match 1..6 mean"] == pytest.approx((3 * 0.99 + 0.6) / 4)
    assert summary["exact_match 1..6 lo"] < summary["exact_match 1..6 mean"]


def test_a_finished_run_whose_last_evaluation_reached_the_target_reached_it(tmp_path):
    from minitfm.lab.many.seeds import reached, run_outcome

    run_dir = fake_run(tmp_path, "r", 0, None, 0.99)
    assert run_outcome(run_dir)["reached"] is False
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["best_exact_match"] = 0.995  # reached at the last step: the run ends "finished"
    (run_dir / "summary.json").write_text(json.dumps(summary))
    found = run_outcome(run_dir)
    assert found["reached"] is True and found["steps"] == BUDGET and found["seed"] == 0
    assert reached(summary, None) is None  # no target (train.target_exact_match=null)


def test_runs_that_did_not_end_are_left_out_of_n(tmp_path):
    rows = sweep_rows(tmp_path, [(0, 100, 0.99), (1, 110, 0.99)])
    rows[1]["status"] = "interrupted"
    (summary,) = configuration_rows(by_configuration(rows), ["seed"], ["1..6"])
    assert (summary["n"], summary["runs"]) == (1, 2) and summary["steps lo"] is None


def test_the_sweeps_files_hold_each_configurations_interval(tmp_path):
    folder = tmp_path / "sw"
    folder.mkdir()
    rows = []
    for value, offset in (("sinusoidal", 0), ("rope", 50)):
        for row in sweep_rows(folder / value, [(s, 100 + offset + s, 0.99) for s in range(3)]):
            row.update({POSITIONAL: value, "configuration": f"{POSITIONAL}={value}"})
            rows.append(row)
    for row in rows:
        row["exact_match"] = {"1..6": 0.99}
    write_results(folder, rows, [POSITIONAL, "seed"])
    table = list(csv.DictReader((folder / "configurations.csv").open()))
    assert [row["model.positional"] for row in table] == ["sinusoidal", "rope"]
    assert [row["#"] for row in table] == ["1", "2"]
    for column in ("steps mean", "steps lo", "steps hi", "steps median", "success_rate lo",
                   "success_rate hi", "seconds lo", "exact_match 1..6 hi"):
        assert column in table[0], column
    assert float(table[0]["steps lo"]) < 101 < float(table[0]["steps hi"])
    lines = [json.loads(line) for line in (folder / "configurations.jsonl").open()]
    assert lines[1]["steps mean"] == 151 and lines[1]["n"] == 3
    assert (folder / "intervals.png").stat().st_size > 0
    header = (folder / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["run", "model.positional", "seed", "status", "reached"]


def test_the_sweep_table_gives_intervals_and_says_how_misses_count(tmp_path):
    from minitfm.app.commands.sweep import sweep_table

    rows = sweep_rows(tmp_path, [(0, 100, 0.99), (1, 120, 0.99), (2, None, 0.5)])
    for row in rows:
        row["configuration"] = "all"
    table = sweep_table(rows, ["seed"], "sweep x")
    headers = [column.header for column in table.columns]
    assert headers == ["#", "n", "exact match 1..6", "at target", "steps to target",
                       "seconds to target"]
    cells = [next(iter(column.cells)) for column in table.columns]
    assert cells[3].startswith("2/3\n") and "±" in cells[4] and "median 120" in cells[4]
    assert "95% Student's t" in table.caption and "step budget" in table.caption
    assert "Wilson" in table.caption


# --- compare ---

def compare(*args):
    return run_cli("compare", *[str(a) for a in args])


def test_two_identical_configurations_show_no_difference(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME, "rope": SAME})
    result = compare(sweep, "1", "positional=rope")
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "paired by seed (8 seeds)" in out
    # Each verdict whole, not a prefix. Every paired difference is 0: the interval [0, 0]
    # touches 0, it never "excludes" it (C8).
    lines = result.stdout.splitlines()
    for sentence in ("held-out exact match: no difference detectable with n = 8 (smallest "
                     "detectable: any difference, as the runs do not vary)",
                     "steps to target: no difference detectable with n = 8 (smallest "
                     "detectable: 18 steps)",
                     "seconds to target: no difference detectable with n = 8 (smallest "
                     "detectable: 1.8 s)",
                     "success rate: no difference detectable with n = 8 (smallest detectable: "
                     "41.5%)"):
        assert sentence in lines, sentence  # the whole line: no clause appended
    assert lines.count("  seeds: no difference observed: give --effect to size one") == 4
    assert "excludes 0" not in result.stdout
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    assert report["paired"] and report["seeds"] == list(range(8))
    assert all(f["p_value"] == 1.0 and f["difference"] == 0 for f in report["figures"])


def test_a_planted_large_difference_is_found_paired_by_seed(tmp_path):
    slow = [(seed, 200 + 5 * seed, 0.99) for seed in range(8)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME, "rope": slow})
    report = json.loads(compare(sweep, "2", "1", "--json").stdout)
    steps = {f["figure"]: f for f in report["figures"]}["steps"]
    assert steps["difference"] == 100 and steps["lo"] == steps["hi"] == 100  # every seed +100
    assert steps["p_value"] == 2 / 256 and "exact over 256 sign flips" in steps["test"]
    assert steps["verdict"].startswith("a difference: A - B = +100 steps")
    result = compare(sweep, "rope", "sinusoidal")
    assert "steps to target: a difference: A - B = +100 steps" in result.stdout
    assert "held-out exact match: no difference detectable" in result.stdout


def test_unpaired_when_the_sides_hold_other_seeds_with_welch_and_a_relabelling_test(tmp_path):
    other = [(seed + 8, 160 + (seed * 7) % 11, 0.97 + 0.002 * seed) for seed in range(6)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME, "rope": other})
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    assert not report["paired"] and report["seeds"] is None
    steps = {f["figure"]: f for f in report["figures"]}["steps"]
    assert steps["n"] == [8, 6] and "Welch" in steps["interval"]
    assert "exact over 3,003 splits" in steps["test"] and steps["p_value"] < 0.01
    assert steps["lo"] < steps["difference"] < steps["hi"] < 0


def test_misses_make_a_success_rate_and_count_at_the_budget(tmp_path):
    misses = [(seed, None if seed < 6 else 100, 0.5) for seed in range(8)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME, "rope": misses})
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    figures = {f["figure"]: f for f in report["figures"]}
    success = figures["success"]
    assert success["a"]["mean"] == 1.0 and success["b"]["mean"] == 0.25
    assert success["difference"] == 0.75 and "Newcombe" in success["interval"]
    assert success["p_value"] < 0.05
    assert figures["steps"]["b"]["mean"] == (6 * BUDGET + 2 * 100) / 8


def test_too_few_seeds_say_no_test_could_detect_anything(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:3],
                                         "rope": [(s, 900, 0.2) for s in range(3)]})
    result = compare(sweep, "1", "2")
    out = " ".join(result.stdout.split())
    assert result.exit_code == 0
    assert ("steps to target: the test cannot decide with n = 3: its smallest possible "
            "p-value, 0.25, is above 0.05 (these runs reach it), so it needs at least 6 seeds "
            "a side") in out


def test_effect_sizes_the_seeds_a_difference_needs(tmp_path):
    noisy = [(seed, 100 + (17 * seed) % 40, 0.99) for seed in range(8)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": noisy, "rope": SAME})
    report = json.loads(compare(sweep, "1", "2", "--effect", "steps=5", "--json").stdout)
    steps = {f["figure"]: f for f in report["figures"]}["steps"]
    assert steps["effect_size"] == 5 and steps["effect_from"] == "--effect"
    assert steps["seeds_needed"] > 8
    assert f"a difference of 5 steps (as --effect) needs {steps['seeds_needed']} seeds a side" \
        in steps["seeds_line"]


def test_run_sets_by_a_and_b_and_two_sweeps(tmp_path):
    for seed, steps, exact in SAME:
        fake_run(tmp_path / "a", f"r{seed}", seed, steps, exact)
        fake_run(tmp_path / "b", f"r{seed}", seed, steps + 300, exact)
    fake_run(tmp_path / "b", "cut", 99, 50, 0.2)
    (tmp_path / "b" / "cut" / "summary.json").unlink()  # killed before its summary: failed
    result = compare("--a", tmp_path / "a", "--b", tmp_path / "b", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["b"]["left_out"] == ["cut (failed)"] and "cut (failed)" in result.stderr
    assert report["paired"] and report["b"]["n"] == 8
    one = fake_sweep(tmp_path / "s1", {"rope": SAME})
    two = fake_sweep(tmp_path / "s2", {"rope": [(s, 400, 0.99) for s in range(8)]})
    report = json.loads(compare(one, "1", two, "rope", "--json").stdout)
    assert report["a"]["label"] == "#1 positional=rope" and report["figures"][1]["p_value"] < 0.01


def test_runs_keeps_working_beside_compare(tmp_path):
    fake_sweep(tmp_path / "sw", {"rope": SAME[:2]})
    result = run_cli("runs", tmp_path / "sw", "--json")
    assert result.exit_code == 0 and len(json.loads(result.stdout)) == 2


def test_runs_lists_a_sweeps_runs_by_seed_not_by_finish_time(tmp_path):
    import os

    sweep = fake_sweep(tmp_path / "runs" / "sw",
                       {"sinusoidal": [(s, 100, 0.99) for s in range(12)],
                        "rope": [(s, 100, 0.99) for s in (1, 0)]})
    lone = fake_run(tmp_path / "runs", "lone", 3, 100, 0.99)
    finished = [11, 4, 0, 7, 2, 10, 1, 9, 3, 5, 8, 6]  # the order the sweep's runs ended in
    for i, seed in enumerate(finished):
        os.utime(sweep / f"positional=sinusoidal,seed={seed}" / "config.yaml", (1e9 + i,) * 2)
    for i, seed in enumerate((1, 0)):
        os.utime(sweep / f"positional=rope,seed={seed}" / "config.yaml", (1e9 + 20 + i,) * 2)
    os.utime(lone / "config.yaml", (1e9 + 10,) * 2)  # before the sweep's last activity
    result = run_cli("runs", tmp_path / "runs", "--json")
    assert result.exit_code == 0, result.stderr
    names = [row["name"] for row in json.loads(result.stdout)]
    by_seed = [f"sw/positional={value},seed={seed}" for seed in range(12)
               for value in (("rope", "sinusoidal") if seed < 2 else ("sinusoidal",))]
    assert names == ["lone", *by_seed], names
    result = run_cli("runs", sweep, "--json")  # the sweep folder's own runs: the same order
    assert [row["name"] for row in json.loads(result.stdout)] == \
        [name.removeprefix("sw/") for name in by_seed]


@pytest.mark.parametrize("args, needle", [
    ([], "compare takes SWEEP A B, SWEEP_A A SWEEP_B B, or --a DIR --b DIR (got 0 arguments)"),
    (["{sw}", "1"], "(got 2 arguments)"),
    (["{sw}", "1", "3"], "B ('3') is no configuration of"),
    (["{sw}", "1", "alibi"], "give its # in the sweep's table (1..2) or its label"),
    (["{tmp}", "1", "2"], "is no sweep folder (no sweep.json)"),
    (["--a", "{sw}"], "--b is missing"),
    (["{sw}", "1", "2", "--a", "{sw}"], "not both"),
    (["--a", "{sw}", "--b", "{sw}"], "is on both sides"),
    (["--a", "{tmp}/nowhere", "--b", "{sw}"], "not found"),
    (["--a", "{tmp}/empty", "--b", "{sw}"], "holds no run directory"),
    (["{sw}", "1", "2", "--effect", "steps"], "--effect ('steps') must look like FIGURE=SIZE"),
    (["{sw}", "1", "2", "--effect", "speed=3"], "FIGURE one of exact_match, steps"),
    (["{sw}", "1", "2", "--effect", "steps=-1"], "SIZE a positive number"),
    (["{sw}", "1", "2", "--effect", "steps=nan"], "SIZE a positive number"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:2], "rope": SAME[:2]})
    (tmp_path / "empty").mkdir()
    filled = [a.format(sw=sweep, tmp=tmp_path) for a in args]
    assert_clean_error(run_cli("compare", *filled), 2, needle)


def test_damaged_or_missing_sweep_results_are_one_line(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"rope": SAME[:2]})
    (sweep / "results.jsonl").write_text('{"run": "../etc", "configuration": "x"}\n')
    assert_clean_error(compare(sweep, "1", "1"), 2, "line 1 of results.jsonl is no row")
    (sweep / "results.jsonl").unlink()
    assert_clean_error(compare(sweep, "1", "1"), 2, "has no results.jsonl yet")
    for run in sweep.glob("positional=*"):
        (run / "summary.json").unlink()
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "last.pt").write_bytes(b"")
    fake = fake_sweep(tmp_path / "sw2", {"rope": SAME[:2], "alibi": SAME[:2]})
    for run in fake.glob("positional=rope,*"):
        (run / "summary.json").unlink()
    assert_clean_error(compare(fake, "1", "2"), 2, "A (#1 positional=rope) has no run that ended")


def test_the_intervals_picture_is_a_forest_plot(tmp_path):
    from minitfm.lab.many.seeds import intervals_figure

    rows = sweep_rows(tmp_path, [(0, 100, 0.99), (1, 120, 0.98), (2, None, 0.5)])
    for row in rows:
        row["configuration"] = "all"
    summaries = configuration_rows(by_configuration(rows), ["seed"], ["1..6"])
    axes = intervals_figure(summaries).get_axes()
    assert [ax.get_title() for ax in axes] == [
        "held-out exact match 1..6", "at target (Wilson interval)",
        "steps to target (misses at the budget)", "seconds to target"]
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["1: all (n=3)"]
    (bar,) = [c for c in axes[2].get_children() if type(c).__name__ == "LineCollection"]
    (segment,) = bar.get_segments()  # steps 100, 120, 200 (the miss): 140 ± 4.303 · √2800 / √3
    assert segment[:, 0] == pytest.approx([140 - 131.45, 140 + 131.45], abs=0.01)


def test_a_side_whose_runs_differ_in_more_than_the_seed_is_noted(tmp_path):
    for seed, steps, exact in SAME[:3]:
        fake_run(tmp_path / "a", f"r{seed}", seed, steps, exact)
        fake_run(tmp_path / "b", f"r{seed}", seed, steps, exact)
    config = tmp_path / "a" / "r0" / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.003", "lr: 0.01"))
    result = compare("--a", tmp_path / "a", "--b", tmp_path / "b")
    assert result.exit_code == 0, result.stderr
    assert "note: the runs of A differ in train.lr: compare pools them" in result.stderr
    assert "runs of B" not in result.stderr


# --- a summary.json with numbers no run writes (M7) ---

BAD_NUMBERS = {
    "wall_nan": ("wall_s", "NaN", "wall_s (nan) is not a number from 0 to 1,000,000,000"),
    "wall_infinity": ("wall_s", "Infinity", "wall_s (inf) is not a number from 0 to"),
    "wall_minus_infinity": ("wall_s", "-Infinity", "wall_s (-inf) is not a number from 0"),
    "wall_huge": ("wall_s", "1e308", "wall_s (1e+308) is not a number from 0 to"),
    "wall_negative": ("wall_s", "-5", "wall_s (-5) is not a number from 0 to"),
    "step_huge": ("step", "1" + "0" * 400, "step (1000"),
    "step_negative": ("step", "-3", "step (-3) is not an integer from 0 to 1,000,000,000"),
    "steps_zero": ("steps", "0", "steps (0) is not an integer from 1 to"),
    "best_nan": ("best_exact_match", "NaN", "best_exact_match (nan) is not a number from -1 to 1"),
    "exact_two": ("exact_match", "2.0", "exact_match (2.0) is not a number from 0 to 1"),
}


def plant(summary_path: Path, key: str, text: str) -> None:
    """`summary.json` with `key` set to the JSON text `text` (NaN, Infinity, a long int)."""
    summary = json.loads(summary_path.read_text())
    summary[key] = "@@"
    summary_path.write_text(json.dumps(summary).replace('"@@"', text))


@pytest.mark.parametrize("name", BAD_NUMBERS)
def test_a_summary_with_numbers_no_run_writes_is_unreadable_and_compare_leaves_it_out(
        tmp_path, name):
    from minitfm.lab.many.seeds import run_outcome
    from minitfm.run.summary import run_status

    key, text, needle = BAD_NUMBERS[name]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:3],
                                         "rope": [(s, 150 + s, 0.98) for s in range(3)]})
    bad = sweep / "positional=rope,seed=1"
    plant(bad / "summary.json", key, text)
    assert run_status(bad) == "unreadable"
    assert needle in run_outcome(bad)["note"]
    result = compare(sweep, "1", "2", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["b"]["n"] == 2 and not report["paired"]
    (left,) = report["b"]["left_out"]
    assert left.startswith("positional=rope,seed=1 (unreadable: summary.json: ") and needle in left
    assert "note: B leaves out 1 run(s) that did not end: positional=rope,seed=1 (unreadable" \
        in result.stderr


def test_the_sweep_table_leaves_out_a_run_whose_summary_holds_nan(tmp_path):
    from minitfm.app.commands.sweep import sweep_table

    runs = [(0, 100, 0.99), (1, 120, 0.99), (2, 140, 0.99)]
    fake_run(tmp_path, "seed=1", 1, 120, 0.99)
    plant(tmp_path / "seed=1" / "summary.json", "wall_s", "NaN")
    plant(tmp_path / "seed=1" / "summary.json", "step", "1" + "0" * 400)
    rows = sweep_rows(tmp_path, runs[:1]) + sweep_rows(tmp_path / "x", runs[2:])
    cfg = load_config(None, [*TINY, "seed=1", f"train.steps={BUDGET}"])
    rows.append(result_row(RunSpec("seed=1", {"seed": "1"}, [], cfg, tmp_path / "seed=1"), []))
    for row in rows:
        row["configuration"] = "all"
    assert rows[-1]["status"] == "unreadable" and rows[-1]["steps"] is None
    table = sweep_table(rows, ["seed"], "sweep x")
    cells = [next(iter(column.cells)) for column in table.columns]
    assert cells[1] == "2 of 3" and cells[4].startswith("120 ± ")


def test_a_run_folder_missing_from_a_sweep_is_called_missing_not_failed(tmp_path):
    import shutil

    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:3], "rope": SAME[:3]})
    shutil.rmtree(sweep / "positional=rope,seed=1")
    result = compare(sweep, "1", "2")
    assert result.exit_code == 0, result.stderr
    assert "leaves out 1 run(s) that did not end: positional=rope,seed=1 (missing)" \
        in result.stderr


def test_an_empty_results_file_says_so_in_one_line(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"rope": SAME[:2]})
    (sweep / "results.jsonl").write_text("")
    result = compare(sweep, "1", "2")
    assert_clean_error(result, 2, "results.jsonl holds no run", "run the sweep command again")
    assert "(1..0)" not in result.stderr


# --- a run is itself however its path is spelled (M8) ---

@pytest.mark.parametrize("spelling", ["absolute", "link", "dots"])
def test_a_configuration_against_itself_is_refused_however_spelled(tmp_path, spelling,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:3], "rope": SAME[:3]})
    (tmp_path / "swlink").symlink_to(tmp_path / "sw")
    other = {"absolute": str(tmp_path / "sw"), "link": "swlink", "dots": "sw/../sw"}[spelling]
    assert_clean_error(compare("sw", "1", other, "1"), 2, "is on both sides")
    assert_clean_error(compare("--a", "sw", "--b", other), 2, "is on both sides")


def test_a_run_given_twice_on_one_side_counts_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for seed, steps, exact in SAME[:3]:
        fake_run(tmp_path / "a", f"r{seed}", seed, steps, exact)
        fake_run(tmp_path / "b", f"r{seed}", seed, steps + 50, exact)
    (tmp_path / "alink").symlink_to(tmp_path / "a")
    result = compare("--a", "a/r0", "--a", "a/../a/r0", "--a", tmp_path / "a" / "r0",
                     "--a", "alink/r0", "--b", "b", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["a"]["n"] == 1
    result = compare("--a", "a", "--a", "alink", "--b", "b", "--json")
    assert json.loads(result.stdout)["a"]["n"] == 3


def test_a_results_file_that_lists_a_run_twice_is_damaged(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:3], "rope": SAME[:3]})
    lines = (sweep / "results.jsonl").read_text()
    (sweep / "results.jsonl").write_text(lines + lines)
    assert_clean_error(compare(sweep, "1", "2", "--json"), 2,
                       "line 7 of results.jsonl repeats the run 'positional=sinusoidal,seed=0'",
                       "run the sweep command again")


# --- what the figures depend on, said when the sides differ in it (L13) ---

def test_sides_measured_against_other_targets_and_tasks_are_noted(tmp_path):
    other = ("train.target_exact_match=0.05", "task.max_len=2")
    for seed, steps, exact in SAME[:3]:
        fake_run(tmp_path / "a", f"r{seed}", seed, steps, exact)
        fake_run(tmp_path / "b", f"r{seed}", seed, steps, exact, overrides=other)
    result = compare("--a", tmp_path / "a", "--b", tmp_path / "b")
    assert result.exit_code == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "settings their figures depend" in x]
    assert "train.target_exact_match (0.99 vs 0.05)" in line and "task.max_len (6 vs 2)" in line
    assert "train.steps" not in line and "seconds to target were measured" not in result.stderr
    report = json.loads(compare("--a", tmp_path / "a", "--b", tmp_path / "b", "--json").stdout)
    assert report["notes"] == [line.removeprefix("note: ")]


def test_two_configurations_of_one_sweep_get_no_such_note(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME[:3], "rope": SAME[:3]})
    result = compare(sweep, "1", "2")
    assert result.exit_code == 0 and "note:" not in result.stderr, result.stderr


def test_a_sweeps_seconds_against_a_lone_run_are_said_to_be_no_timing(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"rope": SAME[:3]})
    fake_run(tmp_path / "alone", "r0", 0, 100, 0.99, overrides=("threads=2",))
    result = compare("--a", sweep, "--b", tmp_path / "alone")
    assert result.exit_code == 0, result.stderr
    assert ("seconds to target were measured under different conditions (A: jobs side by side "
            "in the sweep ") in result.stderr
    assert "B: a run alone, threads=2): their difference is no timing" in result.stderr


# --- one answer: the verdict, the interval and the seeds needed agree (newcomer #1) ---

def test_four_seeds_that_all_differ_one_way_get_one_consistent_answer(tmp_path):
    """The newcomer's case: 4 paired seeds, every one better on A (exact match +5.7%, 4/4 at
    the target against 0/4). The test cannot reach p < 0.05 with 4 seeds, the t interval
    excludes 0: the verdict says both, and the seeds line asks for the seeds the test needs,
    never fewer."""
    a = [(seed, 150 + 10 * seed, 0.99 + 0.002 * seed) for seed in range(4)]
    b = [(seed, None, 0.935 + 0.004 * (seed % 2)) for seed in range(4)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": a, "rope": b})
    result = compare(sweep, "1", "2", "--json")
    assert result.exit_code == 0, result.stderr
    figures = {f["figure"]: f for f in json.loads(result.stdout)["figures"]}
    for name in ("exact_match", "steps", "success"):
        found = figures[name]
        assert found["p_value"] == 2 / 16 and found["smallest_p"] == 2 / 16
        assert found["hi"] < 0 or found["lo"] > 0, found  # the interval excludes 0
        assert "no difference" not in found["verdict"], found["verdict"]
        assert found["verdict"].startswith(
            "the test cannot decide with n = 4: its smallest possible p-value, 0.12, is above "
            "0.05 (these runs reach it), so it needs at least 6 seeds a side; the 95% interval ")
        assert "excludes 0, but it " in found["verdict"]
        assert found["seeds_needed"] == 6 and found["seeds_needed_power"] < 6
        assert found["seeds_line"].startswith("a difference of ")
        assert "needs 6 seeds a side" in found["seeds_line"]
        assert "the test needs at least 6 to reach p < 0.05 at all" in found["seeds_line"]
    assert figures["exact_match"]["verdict"].endswith(
        "excludes 0, but it assumes normally distributed figures, which 4 seeds cannot show")
    assert figures["success"]["verdict"].endswith(
        "excludes 0, but it is a large-sample approximation, rough at 4 seeds")


def test_an_interval_within_the_test_s_reach_is_not_questioned_when_it_spans_0(tmp_path):
    noisy = [(seed, 100 + (17 * seed) % 40, 0.99) for seed in range(8)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": noisy, "rope": SAME})
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    steps = {f["figure"]: f for f in report["figures"]}["steps"]
    assert steps["lo"] < 0 < steps["hi"] and steps["p_value"] >= 0.05
    assert steps["verdict"].startswith("no difference detectable with n = 8 (smallest")
    assert "excludes 0" not in steps["verdict"]
    assert steps["seeds_needed"] == steps["seeds_needed_power"] >= 6


# --- what compare says it did, and what else moved the figures (#55) ---

def edit_summary(run_dir: Path, **values) -> None:
    """Set keys of a run's summary.json (as a stacked run or a run that ended at a time
    writes them)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, **values}))


def test_one_seed_a_side_is_unpaired_because_it_is_one_seed(tmp_path):
    """L5, C2: two one-seed sweeps that both hold seed 0: unpaired, for that reason."""
    one = fake_sweep(tmp_path / "s1", {"sinusoidal": SAME[:1]})
    two = fake_sweep(tmp_path / "s2", {"rope": [(0, 300, 0.9)]})
    result = compare(one, "1", two, "1")
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "), unpaired (one seed a side)" in out
    assert "paired by seed" not in out and "do not hold the same seeds" not in out
    report = json.loads(compare(one, "1", two, "1", "--json").stdout)
    assert (report["paired"], report["seeds"], report["unpaired"]) == \
        (False, None, "one seed a side")
    assert all("unpaired" in f["test"] for f in report["figures"])
    other = fake_sweep(tmp_path / "s3", {"rope": [(1, 300, 0.9)]})
    report = json.loads(compare(one, "1", other, "1", "--json").stdout)
    assert report["unpaired"] == "the sides do not hold the same seeds"
    report = json.loads(compare("--a", one, "--b", two, "--json").stdout)
    assert report["unpaired"] == "one seed a side" and not report["paired"]


def test_a_setting_swept_in_one_sweep_only_is_noted_across_two_sweeps(tmp_path):
    """C6: only the keys that name both configurations of one sweep are exempt."""
    samples = fake_sweep(tmp_path / "s1", {"100": SAME[:3], "200": SAME[:3]},
                         key="train.eval_samples")
    plain = fake_sweep(tmp_path / "s2", {"rope": SAME[:3]})  # train.eval_samples 200 (TINY)
    needle = "train.eval_samples (100 vs 200)"
    result = compare(samples, "train.eval_samples=100", plain, "rope")
    assert result.exit_code == 0, result.stderr
    assert needle in result.stderr, result.stderr
    # Swept in both sweeps, the key still names no configuration of one sweep: noted.
    other = fake_sweep(tmp_path / "s3", {"200": SAME[:3], "300": SAME[:3]},
                       key="train.eval_samples")
    assert needle in compare(samples, "1", other, "1").stderr
    # Two configurations of one sweep: what the comparison is about, not noted.
    result = compare(samples, "1", "2")
    assert result.exit_code == 0 and "note:" not in result.stderr, result.stderr


def test_p_exactly_0_05_is_no_difference(tmp_path):
    """C4: 3 runs against 7, unpaired: 6 of the C(10, 3) = 120 splits are as far apart as the
    one observed, p = 0.05 exactly, which is not below alpha."""
    three = [(seed, steps, 0.99) for seed, steps in zip(range(3), (140, 175, 180))]
    seven = [(seed + 10, 100 + 10 * seed, 0.99) for seed in range(7)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": three, "rope": seven})
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    steps = {f["figure"]: f for f in report["figures"]}["steps"]
    assert steps["p_value"] == 0.05 and steps["test"].endswith("(exact over 120 splits)")
    assert steps["verdict"].startswith("no difference detectable with n = 3 and 7 (smallest "
                                       "detectable: "), steps["verdict"]


def test_stacked_against_unstacked_seconds_name_the_stack_and_only_what_differs(tmp_path):
    plain = fake_sweep(tmp_path / "plain", {"rope": SAME[:4]})
    stacked = fake_sweep(tmp_path / "stacked", {"rope": SAME[:4]})
    for run in stacked.glob("positional=*"):
        edit_summary(run, stack=4)
    result = compare("--a", plain, "--b", stacked)
    assert result.exit_code == 0, result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "seconds to target were" in x]
    assert (f"(A: jobs side by side in the sweep {shown_path(plain)}; B: stacks of 4 runs in "
            f"the sweep {shown_path(stacked)} (a run's seconds are its whole stack's)): their "
            f"difference is no timing") in line, line
    assert "threads=" not in line  # the same on both sides: not named
    # Two sweeps that ran alike: no conditions to tell apart, no note listing the same twice.
    again = fake_sweep(tmp_path / "again", {"rope": SAME[:4]})
    result = compare("--a", plain, "--b", again)
    assert result.exit_code == 0 and "seconds to target were" not in result.stderr, \
        result.stderr


def test_an_observed_difference_too_small_to_resolve_is_not_sized_in_seeds(tmp_path):
    """`a difference of 0.0% (the observed one) needs 9428 seeds a side` read as advice."""
    close = [(seed, 100 + 5 * seed + (seed == 3), 0.99 + 0.0004 * (seed % 2))
             for seed in range(8)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": SAME, "rope": close})
    result = compare(sweep, "1", "2")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert ("  seeds: no difference observed to chase (A - B = -0.02%, less than one held-out "
            "sequence in 200): give --effect to size one") in lines, result.stdout
    assert ("  seeds: no difference observed to chase (A - B = -0.12 steps, less than a step): "
            "give --effect to size one") in lines
    assert "needs" not in "".join(line for line in lines if "seeds: no difference" in line)
    figures = {f["figure"]: f for f in json.loads(compare(sweep, "1", "2", "--json").stdout)
               ["figures"]}
    assert figures["exact_match"]["resolution"] == 1 / 200
    assert figures["exact_match"]["seeds_needed"] is None
    sized = json.loads(compare(sweep, "1", "2", "--effect", "exact_match=0.01", "--json")
                       .stdout)["figures"][0]
    assert sized["seeds_needed"] >= 6 and "(as --effect) needs" in sized["seeds_line"]


def test_seconds_of_sides_that_ran_one_after_the_other_say_so(tmp_path):
    """Newcomer §8: a sweep ran every sinusoidal run, then every rope run, while the load
    changed: the seconds' verdict says so, its figures kept."""
    slow = [(seed, 100 + 5 * seed, 0.99) for seed in range(6)]
    sweep = fake_sweep(tmp_path / "sw", {"sinusoidal": slow, "rope": slow})
    for seed in range(6):  # two jobs side by side: sinusoidal 0..5 then rope 0..5
        for i, value in enumerate(("sinusoidal", "rope")):
            end = f"2026-12-07T{10 + i:02d}:{seed * 5:02d}:00"
            edit_summary(sweep / f"positional={value},seed={seed}", ended=end,
                         wall_s=10.0 + seed + 3 * i)
    clause = "; A's runs ran before B's: the seconds also measure the machine's load then"
    figures = {f["figure"]: f for f in json.loads(compare(sweep, "1", "2", "--json").stdout)
               ["figures"]}
    seconds = figures["seconds"]
    assert seconds["ran_first"] == "A" and seconds["difference"] == -3
    assert seconds["verdict"].startswith("a difference: A - B = -3.0 s [-3.0, -3.0], p = 0.031")
    assert seconds["verdict"].endswith(clause), seconds["verdict"]
    assert clause not in figures["steps"]["verdict"]  # steps have no clock
    result = compare(sweep, "2", "1")
    assert "; B's runs ran before A's: the seconds also" in result.stdout
    for seed in range(6):  # interleaved: seed by seed, one configuration after the other
        for i, value in enumerate(("sinusoidal", "rope")):
            edit_summary(sweep / f"positional={value},seed={seed}",
                         ended=f"2026-12-07T10:{seed * 10 + 5 * i:02d}:00")
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    assert all(f.get("ran_first") is None and "ran before" not in f["verdict"]
               for f in report["figures"])


# --- the settings in which the sides differ, named in every form (#57 item 1) ---

def lr_study(folder: Path, lr: str | None, runs: list[tuple]) -> Path:
    """A sweep of seeds alone, `--seeds` with `train.lr=<lr>` fixed (None: the config's lr), as
    `minitfm sweep` leaves it: one configuration, `all`, whose runs' config.yaml hold the lr."""
    folder.mkdir(parents=True)
    (folder / "sweep.json").write_text(json.dumps({"grid": {}}))
    fixed = (f"train.lr={lr}",) if lr is not None else ()
    rows = []
    for seed, steps, exact in runs:
        fake_run(folder, f"seed={seed}", seed, steps, exact, overrides=fixed)
        rows.append({"run": f"seed={seed}", "seed": seed, "configuration": "all"})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def settings_of(result) -> tuple[str, str]:
    """What the table's title (stdout's first line: piped, nothing wraps) says after each side's
    label: the settings in its own part (`· A: ... · B: ...`), else after `(n = N), `."""
    title = result.stdout.splitlines()[0]
    if " · A: " in title:
        a, _, b = title.split(" · A: ")[1].partition(" · B: ")
        return a, b
    a, _, b = title.partition("  vs  ")
    return a.partition("), ")[2], b.partition("), ")[2]


def test_compare_names_the_lr_of_two_sweeps_in_every_form(tmp_path):
    """Newcomer §2: `compare <sweep lr 0.01> 1 <sweep lr 0.005> 1` said `A: #1 all (n = 8) vs
    B: #1 all (n = 8)`, and nothing named train.lr. Each form of the sides now names it, from
    the runs' config.yaml (not from folder names: these say nothing), and never the seed."""
    one = lr_study(tmp_path / "s1", "0.01", SAME)
    two = lr_study(tmp_path / "s2", "0.005", [(s, 130 + 5 * s, 0.98) for s in range(8)])
    forms = {
        "configurations": [one, "1", two, "1"],
        "sweeps": ["--a", one, "--b", two],
        "run folders": ["--a", one / "seed=0", "--b", two / "seed=1"],  # other seeds: not named
        "lists": ["--a", one / "seed=0", "--a", one / "seed=1",
                  "--b", two / "seed=0", "--b", two / "seed=1"],
    }
    for form, args in forms.items():
        result = compare(*args, "--json")
        assert result.exit_code == 0, (form, result.stderr)
        report = json.loads(result.stdout)
        assert report["differs"] == {"train.lr": {"a": [0.01], "b": [0.005]}}, form
        assert {"label", "n", "runs", "left_out", "differ_in"} <= set(report["a"]), form
        result = compare(*args)
        assert result.exit_code == 0, (form, result.stderr)
        a, b = settings_of(result)
        assert a == "train.lr=0.01" and b.split(", ")[0] == "train.lr=0.005", (form, a, b)
    assert compare(one, "1", two, "1").stdout.splitlines()[0] == (
        "A: #1 all (n = 8), train.lr=0.01  vs  B: #1 all (n = 8), train.lr=0.005, paired by "
        "seed (8 seeds)")
    # The default lr in neither folder's name: nothing but the runs' config.yaml says it.
    plain = lr_study(tmp_path / "s3", None, SAME)
    assert settings_of(compare(plain, "1", two, "1")) == \
        ("train.lr=0.003", "train.lr=0.005, paired by seed (8 seeds)")


def test_settings_already_in_both_labels_are_not_repeated_but_are_in_the_json(tmp_path):
    sweep = fake_sweep(tmp_path / "sw", {"0.01": SAME[:3], "0.005": SAME[:3]}, key="train.lr")
    result = compare(sweep, "1", "2")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        "A: #1 lr=0.01 (n = 3)  vs  B: #2 lr=0.005 (n = 3), paired by seed (3 seeds)")
    report = json.loads(compare(sweep, "1", "2", "--json").stdout)
    assert report["differs"] == {"train.lr": {"a": [0.01], "b": [0.005]}}
    assert report["a"]["label_keys"] == report["b"]["label_keys"] == ["train.lr"]
    # A key the other side's label does not name is said: a run folder against a configuration.
    alone = fake_run(tmp_path / "alone", "r0", 0, 100, 0.99, overrides=("train.lr=0.02",))
    report = json.loads(compare("--a", alone, "--b", sweep / "lr=0.005,seed=0", "--json").stdout)
    assert report["differs"] == {"train.lr": {"a": [0.02], "b": [0.005]}}


def test_a_side_that_pools_several_values_shows_them_all_and_long_headings_break(tmp_path):
    from minitfm.app.text import heading_lines

    pooled = fake_sweep(tmp_path / "sw", {"0.01": SAME[:2], "0.005": SAME[:2]}, key="train.lr")
    other = ("train.lr=0.005", "model.d_ff=128", "train.warmup_steps=7",
             "train.target_exact_match=0.98")
    for seed in range(2):
        fake_run(tmp_path / "b", f"r{seed}", seed, 100, 0.99, overrides=other)
    report = json.loads(compare("--a", pooled, "--b", tmp_path / "b", "--json").stdout)
    assert report["differs"] == {  # in the order of the config; A's runs in order of name
        "model.d_ff": {"a": [64], "b": [128]}, "train.lr": {"a": [0.005, 0.01], "b": [0.005]},
        "train.warmup_steps": {"a": [20], "b": [7]},
        "train.target_exact_match": {"a": [0.99], "b": [0.98]}}
    result = compare("--a", pooled, "--b", tmp_path / "b")
    a = "model.d_ff=64, train.lr=0.005,0.01, train.warmup_steps=20, train.target_exact_match=0.99"
    b = "model.d_ff=128, train.lr=0.005, train.warmup_steps=7, train.target_exact_match=0.98"
    assert settings_of(result) == (a, b)
    lines = heading_lines(result.stdout.splitlines()[0], 100)  # as a terminal 100 wide shows it
    assert lines[1:] == [f"A: {a}", f"B: {b}"]
    assert lines[0].endswith("(n = 2), unpaired (a side holds a seed more than once)")
