"""Reading a run's metrics.jsonl from its end (`last_record`): the last record of a split,
past damaged lines and a torn last line, with no more read than needed."""

import json

from minitfm.lab import curves
from minitfm.lab.curves import last_record, scan_metrics


def gauges(step: int) -> str:
    return json.dumps({"step": step, "split": "gauges", "exact": step / 1000, "loss": 1.0,
                       "token_accuracy": 0.5}) + "\n"


def train(step: int) -> str:
    return json.dumps({"step": step, "split": "train", "loss": 1.0}) + "\n"


def test_the_last_record_of_a_split_past_damage_and_a_torn_line(tmp_path):
    lines = [gauges(s) + train(s) for s in range(1, 500)]
    tail = ["not json\n", '{"step": 600, "split": "gauges", "exact": 7}\n',  # exact > 1
            '{"step": 601, "split": "train", "pad": "' + "x" * 70_000 + '"}\n', train(700),
            '{"step": 701, "split": "gau']  # a killed run's torn last line
    (tmp_path / "metrics.jsonl").write_text("".join(lines + tail))
    assert last_record(tmp_path, "gauges")["step"] == 499
    assert last_record(tmp_path, "train")["step"] == 700
    assert last_record(tmp_path, "eval") is None  # none at all: the whole file read
    records = scan_metrics(tmp_path)[0]  # what reading it all finds last
    assert [r for r in records if r["split"] == "gauges"][-1] == last_record(tmp_path, "gauges")


def test_it_reads_blocks_from_the_end_and_no_further_than_its_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(curves, "TAIL_BLOCK", 100)  # records cut across many blocks
    monkeypatch.setattr(curves, "TAIL_LIMIT", 5_000)
    (tmp_path / "metrics.jsonl").write_text(gauges(1) + "".join(train(s) for s in range(2, 200)))
    assert last_record(tmp_path, "train")["step"] == 199
    assert last_record(tmp_path, "gauges") is None  # 10 kB back: past the limit
    (tmp_path / "metrics.jsonl").write_text(gauges(1) + "".join(train(s) for s in range(2, 40)))
    assert last_record(tmp_path, "gauges")["step"] == 1  # the file's first line, whole
    assert last_record(tmp_path / "none", "gauges") is None
