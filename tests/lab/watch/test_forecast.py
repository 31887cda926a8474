"""The forecast (lab/watch/forecast.py) made from the gauges' readings, and how well it forecasts
over finished runs (lab/watch/forecast_check.py,
`python -m minitfm.lab.watch.forecast_check FOLDER...`)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys

import pytest

from minitfm.config import TrainConfig, load_config, to_yaml
from minitfm.lab.watch import forecast_check
from minitfm.lab.watch.forecast import (
    ANNEALING_GAIN,
    MARGIN,
    Course,
    click_accuracy,
    fit_line,
    make_forecast,
)
from minitfm.lab.watch.forecast_check import replay, table


def test_the_click_accuracy_is_where_every_token_right_gives_half_the_pairs():
    assert click_accuracy([4]) == pytest.approx(0.5 ** (1 / 4))
    mixed = click_accuracy([2, 17])  # mean(acc^2, acc^17) = 1/2
    assert (mixed ** 2 + mixed ** 17) / 2 == pytest.approx(0.5)
    lengths = list(range(2, 18))  # reverse 1..16 and EOS: the default's
    assert click_accuracy(lengths) == pytest.approx(0.9231, abs=1e-4)


def climb(steps: range, start: float, slope: float, dips=()) -> list[tuple]:
    """Readings whose token accuracy's logit rises in a straight line (knocked down at
    `dips`), exact match flat at 10%."""
    def accuracy(s):
        y = start + slope * s - (3.0 if s in dips else 0.0)
        return 1 / (1 + math.exp(-y))
    return [(s, 0.1, accuracy(s)) for s in steps]


def course(lengths=(4,), task="reverse", **train) -> Course:
    """A run's course: the default's train section but for `train`."""
    return Course(TrainConfig(**{"lr": 0.01, "warmup_steps": 0, "steps": 240, **train}),
                  list(lengths), task)


def test_the_schedule_areas_sum_the_learning_rate_and_how_far_it_came_down():
    constant = course(schedule="constant", warmup_steps=40)
    assert constant.lr_area(40) == pytest.approx(0.01 * 41 / 2)  # the warmup's ramp
    assert constant.lr_area(140) == pytest.approx(0.01 * 41 / 2 + 0.01 * 100)
    assert constant.annealing_area(240) == pytest.approx(0.0, abs=1e-12)  # it never comes down
    cosine = course(warmup_steps=40)  # cosine from 0.01 to 0 over steps 40..240: mean 0.005
    assert cosine.annealing_area(240) == pytest.approx(0.01 * 200 / 2, rel=0.01)
    assert cosine.annealing_area(40) == 0.0 and cosine.annealing_area(140) > 0
    # a long run sums on a grid of steps: the areas come out the same
    long = course(warmup_steps=0, steps=1_000_000)
    assert long.stride > 1
    assert long.annealing_area(1_000_000) == pytest.approx(0.01 * 1_000_000 / 2, rel=1e-3)


def test_the_forecast_extrapolates_the_climb_to_the_click_and_the_target():
    """With a constant lr the areas grow with the steps, so a climb straight in the steps is
    a straight line in the forecast's terms, and it says where that line reaches the click
    accuracy and the target's."""
    run = course(schedule="constant", steps=500)
    click = math.ceil((run.click_logit + 2.0) / 0.02)  # where the line reaches the click
    target = math.ceil((run.target_logit + 2.0) / 0.02)  # and 99% exact match
    forecast = make_forecast(climb(range(10, 101, 10), -2.0, 0.02), run)
    assert (forecast.click_step, forecast.target_step, forecast.clicked) == (click, target, False)
    assert forecast.verdict == "on course"  # 400 with 100 of 500 steps to spare
    assert forecast.text == f"click expected ~step {click}, on course for 99% ~step {target}"
    # a reading knocked down counts as the best before it: the forecast barely moves
    dipped = make_forecast(climb(range(10, 101, 10), -2.0, 0.02, dips={60, 90}), run)
    assert abs(dipped.click_step - click) <= 10


def test_the_forecast_knows_the_schedule_a_decaying_lr_brings_the_click_sooner():
    """The same climb under a cosine decay: the annealing area adds to the line, so the click
    comes sooner and the target within the run; a budget cut short leaves it in the run's last
    eighth (not on course: the target comes later than forecast often enough) or out of reach."""
    readings = climb(range(10, 101, 10), -2.0, 0.02)
    constant = make_forecast(readings, course(schedule="constant"))
    cosine = make_forecast(readings, course())
    assert cosine.click_step < constant.click_step
    assert constant.target_step is None and cosine.target_step is not None  # 99% within 240
    tight = make_forecast(readings, course(steps=200))  # 99% in the last eighth of the run
    assert tight.verdict == "close call" and tight.target_step > 200 * (1 - MARGIN)
    assert tight.text.endswith(f", close call: 99% ~step {tight.target_step} of 200")
    short = make_forecast(readings, course(steps=140))
    assert short.verdict == "short" and short.target_step is None and short.end_exact < 0.99
    assert short.text.endswith(f", short of 99%: ~{short.end_exact:.0%} at the end")
    unset = make_forecast(readings, course(target_exact_match=None, steps=400))
    assert unset.verdict is None and unset.target_step is None
    # a line carried on may give 100%, which no run can promise: at most 99.9%
    assert unset.end_exact > 0.9995 and unset.text.endswith(", ~99.9% at the end")


def test_the_forecast_waits_says_when_no_click_comes_and_when_one_came():
    run = course(schedule="constant", warmup_steps=80)
    assert make_forecast(climb(range(10, 71, 10), -2.0, 0.02), run) is None  # in the warmup
    # the line goes through readings after the warmup only, and it takes three of them
    assert make_forecast(climb(range(10, 91, 10), -2.0, 0.02), run) is None
    assert make_forecast(climb(range(10, 101, 10), -2.0, 0.02), run) is not None
    no_warmup = course(schedule="constant")  # from a fifth of the run, 48: the first is left out
    assert make_forecast(climb(range(10, 41, 10), -2.0, 0.02), no_warmup) is None
    assert make_forecast(climb(range(10, 51, 10), -2.0, 0.02), no_warmup) is not None
    slow = make_forecast(climb(range(10, 101, 10), -2.0, 0.005), run)
    assert slow.click_step is None and slow.target_step is None
    assert slow.text.startswith("no click by the run's end (step 240), short of 99%: ~")
    flat = make_forecast(climb(range(10, 101, 10), 0.5, 0.0), run)
    assert flat.click_step is None and flat.end_exact == pytest.approx(run.exact(0.5))
    history = [(s, 0.55 if s >= 80 else 0.1, a) for s, _, a in climb(range(10, 101, 10), -2.0,
                                                                       0.02)]
    seen = make_forecast(history, run)
    assert (seen.click_step, seen.clicked) == (80, True)
    assert seen.text == "clicked at step 80 (gauges: 55% exact), short of 99%: " \
        f"~{seen.end_exact:.0%} at the end"  # a constant lr and 140 steps left: 84%
    history[-1] = (100, 0.45, history[-1][2])  # knocked back under 50%: not clicked after all
    assert make_forecast(history, run).text.startswith("click expected ~step")
    history[-1] = (100, 0.995, history[-1][2])  # past the target on these pairs
    passed = make_forecast(history, run)
    assert (passed.verdict, passed.target_step) == ("passed", 100)
    assert passed.text == \
        "clicked at step 80 (gauges: 99.5% exact, past 99%: an evaluation decides)"
    # at the run's last step there is no end left to forecast
    warm = [(s, 0.55 if s >= 50 else 0.1, a) for s, _, a in history[:5]]
    early = make_forecast(warm, run)  # a click in the warmup: seen, with no line to judge by
    assert (early.click_step, early.verdict) == (50, None)
    assert early.text == "clicked at step 50 (gauges: 55% exact)"
    history[-1] = (100, 0.55, history[-1][2])
    last = course(schedule="constant", warmup_steps=80, steps=100)
    assert make_forecast(history, last).text == "clicked at step 80 (gauges: 55% exact)"


def test_on_a_task_it_was_never_measured_on_the_forecast_says_uncalibrated():
    """The forecast was measured on reverse, sort and copy (docs/looking-inside.md, "How well it
    forecasts"). On another task its line's figures come behind `uncalibrated for TASK:`, with
    no verdict; the numbers are the same (the replay measures the verdict there too)."""
    readings = climb(range(10, 101, 10), -2.0, 0.02)
    for task in ("reverse", "sort", "copy"):  # the default's words: a verdict, no caveat
        said = make_forecast(readings, course(task=task, schedule="constant", steps=500))
        assert said.text.startswith("click expected ~step ") and ", on course for 99%" in said.text
    measured = make_forecast(readings, course(schedule="constant", steps=500))
    grokking = make_forecast(readings, course(task="modadd", schedule="constant", steps=500))
    assert grokking.text == f"uncalibrated for modadd: click expected ~step " \
        f"{measured.click_step}, 99% ~step {measured.target_step}"
    assert (grokking.click_step, grokking.target_step, grokking.end_exact, grokking.verdict) == \
        (measured.click_step, measured.target_step, measured.end_exact, "on course")
    short = make_forecast(readings, course(task="pairs", steps=140))
    assert short.verdict == "short" and short.text == \
        f"uncalibrated for pairs: click expected ~step {short.click_step}, " \
        f"~{short.end_exact:.0%} at the end"
    run = course(task="add", schedule="constant", warmup_steps=80)
    history = [(s, 0.55 if s >= 80 else 0.1, a) for s, _, a in readings]
    seen = make_forecast(history, run)  # what the readings show is said as it is
    assert seen.text == "clicked at step 80 (gauges: 55% exact), uncalibrated for add: " \
        f"~{seen.end_exact:.0%} at the end"
    history[-1] = (100, 0.995, history[-1][2])
    assert make_forecast(history, run).text == \
        "clicked at step 80 (gauges: 99.5% exact, past 99%: an evaluation decides)"


def test_a_target_below_the_click_passed_says_so_in_the_gauges_words():
    """train.target_exact_match=0.3 passed at 35% on the gauges' pairs, no click yet."""
    readings = [(s, 0.35 if s == 100 else 0.1, a) for s, _, a in climb(range(10, 101, 10),
                                                                        -2.0, 0.02)]
    passed = make_forecast(readings, course(schedule="constant", target_exact_match=0.3))
    assert (passed.verdict, passed.target_step, passed.clicked) == ("passed", 100, False)
    assert passed.text == f"click expected ~step {passed.click_step} (gauges: 35% exact, past " \
        "30%: an evaluation decides)"


def test_the_line_leaves_out_the_first_reading_the_untrained_models():
    """With no warmup, a first reading far below the climb (the untrained model's) moves
    nothing: the click is where the climb alone puts it."""
    run = course(schedule="constant")
    straight = climb(range(10, 51, 10), -2.0, 0.02)  # from step 48 on: a line through 20..50
    low_first = [(10, 0.1, 1 / (1 + math.exp(6.0))), *straight[1:]]  # logit -6 at step 10
    click = make_forecast(straight, run).click_step
    assert click is not None and make_forecast(low_first, run).click_step == click


def test_flat_readings_under_a_decaying_lr_forecast_no_unlearning():
    """Flat readings under the cosine decay, whose line against the lr's area (the annealing
    taken out) falls: a run does not unlearn, so from today on the line rises by the annealing
    to come at least, and the end is no lower than today's accuracy."""
    flat = climb(range(10, 101, 10), 0.5, 0.0)
    run = course()
    line = fit_line(flat, run)
    for t in range(110, 241, 10):
        lift = ANNEALING_GAIN * (run.annealing_area(t) - run.annealing_area(100))
        assert line(t) - line(100) >= lift - 1e-9
    assert make_forecast(flat, run).end_exact >= run.exact(0.5)


# --- how well it forecasts (lab/watch/forecast_check.py) ---

def fake_run(folder, name: str, readings: list[tuple], best: float, steps: int = 280):
    """A run directory as a sweep leaves one: its config, its gauge readings, its summary."""
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    cfg = load_config(None, [f"train.steps={steps}"])
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "split": "gauges", "exact": e, "loss": 1.0, "token_accuracy": a})
        + "\n"
        for s, e, a in readings))
    (run_dir / "summary.json").write_text(json.dumps({"best_exact_match": best,
                                                      "status": "finished", "steps": steps}))


def test_the_calibration_replays_each_runs_readings_and_counts_flags_and_false_alarms(tmp_path):
    """Two seeds of one configuration climb alike and are flagged from step 100 on; the one
    that reached its target counts as flagged in time, the other as a false alarm. A third,
    flat, is never flagged; its configuration row counts it apart."""
    climbing = climb(range(10, 161, 10), -2.0, 0.03)
    clicked = [(s, 0.6 if s >= 140 else 0.1, a) for s, _, a in climbing]  # the click: 140
    fake_run(tmp_path, "seed=0", clicked, best=0.995)
    fake_run(tmp_path, "seed=1", clicked, best=0.97)
    fake_run(tmp_path, "steps=150,seed=0", climb(range(10, 151, 10), 0.5, 0.0), best=0.4,
             steps=150)
    rows = table([tmp_path], notes := []).splitlines()
    assert notes == []
    name = tmp_path.name
    assert rows[2] == f"| {name} | 1 of 2 | 1 of 1 (29%) | 1 of 1 | 140-140 | 100% |"
    assert rows[3] == f"| {name}/steps=150 | 0 of 1 | - | 0 of 1 | never | - |"


def bent(steps: range, start: float, slope: float, bend: int, after: float) -> list[tuple]:
    """Readings whose token accuracy's logit climbs by `slope` a step up to `bend`, by `after`
    from there; exact match flat at 10%."""
    def accuracy(s):
        y = start + slope * min(s, bend) + after * max(s - bend, 0)
        return 1 / (1 + math.exp(-y))
    return [(s, 0.1, accuracy(s)) for s in steps]


def test_a_flag_raised_late_is_not_in_time_and_one_on_course_reading_is_a_false_alarm(tmp_path):
    """A run that reached its target, flagged only from step 120 with its click at 140 (past
    three quarters of its plateau, 105): reached, not flagged in time. A run that missed it,
    its climb flattening after step 90, on course at step 100 alone: a false alarm."""
    late = [(s, 0.6 if s >= 140 else 0.1, a)
            for s, _, a in bent(range(10, 161, 10), -2.0, 0.012, 110, 0.1)]
    fake_run(tmp_path / "late", "seed=0", late, best=0.995)
    fake_run(tmp_path / "flattening", "seed=0", bent(range(10, 161, 10), -2.0, 0.03, 90, 0.0),
             best=0.4)
    def verdicts(name):  # the forecasts' verdicts on the target at steps 100-130
        readings, forecasts, _ = replay(tmp_path / name / "seed=0")
        return [(step, f.verdict) for (step, *_), f in zip(readings, forecasts)
                if 100 <= step <= 130]

    assert verdicts("late") == [(100, "close call"), (110, "close call"), (120, "on course"),
                                (130, "on course")]
    assert verdicts("flattening") == [(100, "on course"), (110, "close call"),
                                      (120, "close call"), (130, "close call")]
    rows = table([tmp_path / "late", tmp_path / "flattening"], []).splitlines()
    assert rows[2:] == ["| late | 1 of 1 | 0 of 1 | - | 140-140 | 0% |",
                        "| flattening | 0 of 1 | - | 1 of 1 | never | - |"]


def replay_cli(cwd, *folders, process=False):
    """`python -m minitfm.lab.watch.forecast_check FOLDER...` run in `cwd`: its `main` in this
    process (a second's torch import less a call), or the command itself with `process=True`."""
    command = [sys.executable, "-m", "minitfm.lab.watch.forecast_check", *folders]
    if process:
        return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = forecast_check.main(list(folders))
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())


CLIMBING = [(s, 0.6 if s >= 140 else 0.1, a) for s, _, a in climb(range(10, 161, 10), -2.0, 0.03)]
ROW = "| sweep | 1 of 1 | 1 of 1 (29%) | - | 140-140 | 100% |"  # CLIMBING's, its target reached


def test_a_run_whose_summary_is_damaged_is_skipped_with_a_note(tmp_path):
    fake_run(tmp_path / "sweep", "seed=0", CLIMBING, best=0.995)
    fake_run(tmp_path / "sweep", "seed=1", CLIMBING, best=0.995)
    (tmp_path / "sweep" / "seed=1" / "summary.json").write_text("{oops")
    done = replay_cli(tmp_path, "sweep")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines()[2:] == [ROW]
    assert done.stderr.startswith("note: run 'sweep/seed=1' skipped: summary.json is not valid "
                                  "JSON") and len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("step,exact,tokens", [(10 ** 400, 0.9, 0.99), (281, 0.9, 0.99),
                                               (95, 7.0, -5.0), (95, 0.1, 1.5), (95, -0.1, 0.999)],
                         ids=["401-digit-step", "past-train-steps", "exact-7", "tokens-1.5",
                              "exact-below-0"])
def test_readings_out_of_range_are_skipped_never_a_traceback_nor_a_click(tmp_path, step, exact,
                                                                         tokens):
    """A reading no run makes (a step past train.steps, an accuracy outside 0..1), put among
    the readings of a run that never clicked nor was on course, changes nothing: no click, no
    false alarm, no traceback."""
    flat = climb(range(10, 161, 10), 0.5, 0.0)
    fake_run(tmp_path / "sweep", "seed=0", flat[:9] + [(step, exact, tokens)] + flat[9:], best=0.4)
    done = replay_cli(tmp_path, "sweep")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[2:] == ["| sweep | 0 of 1 | - | 0 of 1 | never | - |"]


def test_a_reading_written_again_after_a_resume_counts_once(tmp_path):
    """A run killed between checkpoints with an older minitfm has its readings past the
    checkpoint twice, the resumed run's last: the replay takes each step once, in step
    order, as the resumed run made it."""
    doubled = CLIMBING[:12] + [(s, 0.9, 0.999) for s, *_ in CLIMBING[10:13]] + CLIMBING[10:]
    fake_run(tmp_path / "sweep", "seed=0", doubled, best=0.995)
    readings, _, _ = replay(tmp_path / "sweep" / "seed=0")
    assert readings == [(s, e, pytest.approx(a)) for s, e, a in CLIMBING]


@pytest.mark.parametrize("args,needle", [
    (["no-such-dir"], "no finished runs in 'no-such-dir' (no such folder)"),
    (["a-file"], "no finished runs in 'a-file' (a file, not a folder)"),
    (["empty"], "no finished runs in 'empty' (no run folder in it holds a summary.json"),
    ([], "give one or more folders of finished runs")])
def test_no_finished_runs_to_replay_is_one_line_and_exit_2(tmp_path, args, needle):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty").mkdir()
    done = replay_cli(tmp_path, *args, process=not args)  # the command itself once
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stdout)
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr


def test_a_folder_whose_runs_are_all_skipped_has_no_finished_runs(tmp_path):
    """An unfinished run is skipped too: with no other, the folder has none to replay."""
    fake_run(tmp_path / "sweep", "seed=0", CLIMBING, best=0.995)
    summary = tmp_path / "sweep" / "seed=0" / "summary.json"
    summary.write_text(json.dumps({"status": "interrupted", "best_exact_match": 0.5}))
    done = replay_cli(tmp_path, "sweep")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "note: run 'sweep/seed=0' skipped: it is interrupted, not finished",
        "error: no finished runs in 'sweep' (1 skipped: see the notes above): give folders of "
        "finished runs, such as a sweep's"]
