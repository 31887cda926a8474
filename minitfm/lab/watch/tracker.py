"""MLflow: each run as an MLflow run when log.mlflow names a tracker (docs/experiments.md#mlflow),
on a thread of its own (which tracker, whether it answers, its client and a sweep's own run are
`tracking.py`'s: a server's client speaks its REST API, and mlflow is imported only for a local
store, on this thread).

What a run logs (`MlflowTracker`): its resolved config flattened as params (`train.lr`), `seed`
and `task` as tags, config.yaml as an artifact; every number of metrics.jsonl as a metric by
step, named by its split and key (`train/loss`, `eval/exact_match`, `gauges/align`,
`gauges/forecast/click_step`: see `metric_values`); at the end its summary (summary.json, its
numbers as `summary/<key>`, its status as a tag) and the last attention snapshot's pictures, one
per kind with every layer and head (`attention/<task>-step<N>-<kind>.png`). The MLflow run is
named as the run folder, in the experiment MLFLOW_EXPERIMENT_NAME, else the config's `name`.
`mlflow.json` in the run folder holds the MLflow run's id and how many lines of metrics.jsonl
went there: `train --resume` continues that run from the next line. A sweep's runs are the
children of the sweep's own MLflow run (`tracking.SweepRun`), whose id they find in PARENT_ENV.

Training never waits for the tracker: a `Sender` thread reads the lines metrics.jsonl gained
every POLL_S seconds (the file is the queue: nothing piles up in memory), sends each batch in
one call and sleeps between; the training thread hands it the end, and nothing else. A tracker
server that does not answer is refused before the run folder is made (one line, exit 2); one
that fails later ends the logging, said once in a `warning:` line, and the run goes on
(metrics.jsonl, and TensorBoard, keep every record); one that takes no files says so once. At
the end the thread has FLUSH_S seconds to send the rest; it is a daemon thread, so a tracker
that hangs never holds the process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from minitfm.config import Config, flatten
from minitfm.lab.watch.tracking import (
    PARENT_ENV,
    brief,
    check_tracker,
    client_for,
    existing_run,
    experiment_id,
    param_text,
    python_warning,
    read_record,
    tracking_uri,
    unserved,
    write_record,
)
from minitfm.run.instruments import (
    Ended,
    Evaluation,
    Instrument,
    Preparing,
    SnapshotDue,
    Started,
    TrainLine,
)
from minitfm.run.rundir import open_run_file

POLL_S = 2.0  # seconds between two looks at metrics.jsonl
FLUSH_S = 10.0  # seconds the end waits for the last records to go
METRIC_NAME = re.compile(r"[\w\-. ]+(/[\w\-. ]+)*")  # what MLflow takes (Windows too)
STATUSES = {"finished": "FINISHED", "stopped at target": "FINISHED", "interrupted": "KILLED",
            "paused": "KILLED"}  # summary.json's status -> the MLflow run's (no summary: FAILED)


def metric_values(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's numbers by MLflow metric name, `<split>/<key>` (a dict's keys
    joined on: `gauges/forecast/click_step`). Lists (the gauges by position and head), text,
    booleans and null are left out, and so is a number that is not finite (metrics.jsonl
    writes one as null already: `run.files.to_json`) or a name MLflow refuses (a hand edit)."""
    def numbers(value: Any, name: str) -> Iterator[tuple[str, float]]:
        if isinstance(value, dict):
            for key, item in value.items():
                yield from numbers(item, f"{name}/{key}")
        elif isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and METRIC_NAME.fullmatch(name):
            yield name, float(value)

    split = record.get("split")
    if not isinstance(split, str) or not isinstance(record.get("step"), int):
        return {}
    return dict(numbers({k: v for k, v in record.items() if k not in ("step", "split")}, split))


def config_params(cfg: Config) -> dict[str, str]:
    """The resolved config, flattened: `train.lr` -> `0.01` (`config.flatten`: None is null)."""
    return {key: param_text(value) for key, value in flatten(cfg.model_dump(mode="json")).items()}


class MlflowTracker(Instrument):
    """Logs the run to MLflow when log.mlflow names a tracker (see the module docstring); its
    pictures are the snapshots of `attention` (None: no pictures); `warn` says in a line that
    the tracker failed, or took no files, once each."""

    def __init__(self, attention=None, warn: Callable[[str], None] | None = None):
        self.attention, self.warn = attention, warn or python_warning
        self.sender: Sender | None = None
        self.snapshot = None  # the latest attention snapshot, drawn at the end
        self.said: set[str] = set()  # what was said of the thread's: failure, unserved

    def on_prepare(self, preparing: Preparing) -> None:
        """Refuse a tracker that cannot work before anything is written (see `check_tracker`)."""
        uri = tracking_uri(preparing.cfg.log.mlflow)
        if uri is not None:
            check_tracker(uri)

    def on_start(self, run: Started) -> None:
        uri = tracking_uri(run.cfg.log.mlflow)
        if uri is not None:
            self.sender = Sender(uri, run.run_dir, run.cfg, run.task,
                                 os.environ.get(PARENT_ENV) or None)
            self.sender.start()

    def on_snapshot(self, due: SnapshotDue) -> None:
        if self.sender is not None and self.attention is not None:
            self.snapshot = self.attention.take(due.step, due.model)  # the recorder's, taken

    def on_train_line(self, line: TrainLine) -> None:
        self.say()

    def on_evaluation(self, evaluation: Evaluation) -> None:
        self.say()

    def on_end(self, ended: Ended) -> None:
        """The summary and the pictures to the thread; wait up to FLUSH_S for it to end."""
        if self.sender is not None:
            self.finish(ended.summary)

    def close(self) -> None:
        """A run that ended without `Ended` (it failed): its MLflow run is marked FAILED."""
        if self.sender is not None:
            self.finish(None)

    def finish(self, summary: dict[str, Any] | None) -> None:
        sender, self.sender = self.sender, None
        sender.end(summary, self.snapshot)
        sender.join(FLUSH_S)
        if sender.is_alive() and sender.failure is None:
            after = f" after step {sender.step}" if sender.step is not None else ""
            sender.failure = (f"did not take this run's records{after} within {FLUSH_S:g} s of "
                              f"its end: metrics.jsonl has them")
        self.say(sender)

    def say(self, sender: Sender | None = None) -> None:
        """That the tracker took no files, and the thread's failure, each said once."""
        sender = sender or self.sender
        if sender is None:
            return
        for kind, text in (("unserved", sender.unserved), ("failure", sender.failure)):
            if text is not None and kind not in self.said:
                self.said.add(kind)
                self.warn(text if kind == "unserved" else f"MLflow at {sender.uri} {text}")


class Sender(threading.Thread):
    """The thread that talks to MLflow for one run (see the module docstring): it opens or
    continues the MLflow run, sends metrics.jsonl's new lines every POLL_S seconds, and at the
    end the last ones, the summary and the pictures. Its first failure ends it, in `failure`."""

    def __init__(self, uri: str, run_dir: Path, cfg: Config, task, parent: str | None):
        super().__init__(name="minitfm-mlflow", daemon=True)
        self.uri, self.run_dir, self.cfg, self.task, self.parent = uri, run_dir, cfg, task, parent
        self.ends: queue.Queue = queue.Queue(maxsize=1)  # the one thing the run hands over
        self.failure: str | None = None
        self.unserved: str | None = None  # the warning that the tracker takes no files
        self.client = self.mlflow_run = None  # MLflow's client; the run's (`Found`)
        self.lines = 0  # lines of metrics.jsonl sent
        self.offset = 0  # bytes of metrics.jsonl read
        self.step: int | None = None  # the step of the last record sent

    def end(self, summary: dict[str, Any] | None, snapshot) -> None:
        """The run ended (`summary` None: it failed): send the rest, then end the MLflow run."""
        with contextlib.suppress(queue.Full):
            self.ends.put_nowait((summary, snapshot))

    def run(self) -> None:
        try:
            self.client = client_for(self.uri)
            self.open_run()
            while True:
                try:
                    summary, snapshot = self.ends.get(timeout=POLL_S)
                except queue.Empty:
                    self.send_lines()
                    continue
                self.send_lines()
                self.close_run(summary, snapshot)
                return
        except Exception as err:  # whatever the tracker did: the run goes on without it
            after = f" after step {self.step}" if self.step is not None else ""
            self.failure = (f"stopped taking this run's records{after} ({brief(err)}): the run "
                            f"goes on without it, and metrics.jsonl keeps every record")

    @property
    def run_id(self) -> str:
        return self.mlflow_run.run_id

    def open_run(self) -> None:
        """The MLflow run of mlflow.json, continued (a resume), else a new one."""
        record = read_record(self.run_dir)
        self.mlflow_run = existing_run(self.client, record.get("run_id"))
        if self.mlflow_run is None:
            self.mlflow_run, self.lines = self.new_run(), 0
        else:
            self.lines = record.get("lines", 0)
            self.client.update(self.run_id, "RUNNING")
            self.resume_params(self.mlflow_run.params)
        # a resume keeps the lines up to its checkpoint (`rundir.drop_records_after`)
        self.offset, self.lines = line_end(self.run_dir / "metrics.jsonl", self.lines)
        self.write_record()
        self.send_files({"config.yaml": (self.run_dir / "config.yaml").read_bytes()})

    def new_run(self):
        """A new MLflow run: named as the run folder, `seed` and `task` as tags, the config as
        params; under the parent's run (and in its experiment) where there is one."""
        client, cfg = self.client, self.cfg
        tags = {"seed": str(cfg.seed), "task": cfg.task.name,
                "minitfm.run_dir": str(self.run_dir.resolve())}
        if self.parent:
            parent = client.run(self.parent)
            if parent is None:
                raise LookupError(f"the sweep's run {self.parent} is not there")
            experiment, tags["mlflow.parentRunId"] = parent.experiment_id, self.parent
        else:
            experiment = experiment_id(client, os.environ.get("MLFLOW_EXPERIMENT_NAME")
                                       or cfg.name)
        run = client.create_run(experiment, self.run_dir.name, tags)
        client.log_batch(run.run_id, params=config_params(cfg))
        return run

    def resume_params(self, logged: dict[str, str]) -> None:
        """A resumed run's config against the params logged (which MLflow never changes): a
        new key as a param, a changed one as the tag `resumed.<key>`."""
        now = config_params(self.cfg)
        self.client.log_batch(
            self.run_id, params={k: v for k, v in now.items() if k not in logged},
            tags={f"resumed.{k}": v for k, v in now.items() if k in logged and logged[k] != v})

    def send_lines(self) -> None:
        """The complete lines metrics.jsonl gained, as metrics, in one call."""
        lines, self.offset = read_lines(self.run_dir / "metrics.jsonl", self.offset)
        if not lines:
            return
        stamp, metrics, step = int(time.time() * 1000), [], self.step
        for line in lines:
            record = parsed(line)
            values = metric_values(record)
            metrics += [(key, value, stamp, record["step"]) for key, value in values.items()]
            step = record["step"] if values else step
        self.client.log_batch(self.run_id, metrics=metrics)
        self.lines, self.step = self.lines + len(lines), step
        self.write_record()

    def close_run(self, summary: dict[str, Any] | None, snapshot) -> None:
        """The summary (its numbers, status and file) and the pictures; the run's status."""
        if summary is not None:
            stamp = int(time.time() * 1000)
            numbers = metric_values({"step": summary["step"], "split": "summary", **summary})
            self.client.log_batch(
                self.run_id, metrics=[(k, v, stamp, summary["step"]) for k, v in numbers.items()],
                tags={"status": str(summary["status"])})
            if (self.run_dir / "summary.json").is_file():
                self.send_files({"summary.json": (self.run_dir / "summary.json").read_bytes()})
        if snapshot is not None:
            self.send_files(attention_pictures(snapshot, self.task), "attention")
        status = STATUSES.get(summary["status"], "FAILED") if summary else "FAILED"
        self.client.update(self.run_id, status)

    def send_files(self, files: dict[str, bytes], folder: str = "") -> None:
        """Files into the run's artifacts, if the tracker takes them (else a warning, once:
        the run folder has them)."""
        if self.client.serves_files(self.mlflow_run):
            self.client.log_files(self.mlflow_run, files, folder)
        elif self.unserved is None:
            self.unserved = unserved(self.uri, self.mlflow_run, "config.yaml, summary.json and the "
                                     "attention pictures", self.run_dir)

    def write_record(self) -> None:
        write_record(self.run_dir, {"run_id": self.run_id, "lines": self.lines})


def read_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """The complete lines of `path` from byte `offset` on, and the offset after them."""
    try:
        with open_run_file(path) as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    whole = data[:data.rfind(b"\n") + 1]  # a line still being written waits for next time
    return whole.splitlines(), offset + len(whole)


def line_end(path: Path, lines: int) -> tuple[int, int]:
    """The byte offset after the first `lines` lines of `path`, and their count (fewer, if the
    file has fewer)."""
    offset = count = 0
    with contextlib.suppress(FileNotFoundError), open_run_file(path) as f:
        while count < lines and (line := f.readline()).endswith(b"\n"):
            offset, count = offset + len(line), count + 1
    return offset, count


def parsed(line: bytes) -> dict[str, Any]:
    """A line of metrics.jsonl as its record ({} for a line that is none)."""
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def attention_pictures(snapshot, task) -> dict[str, bytes]:
    """The snapshot's maps as PNG files by name, one per kind with every layer and head (as
    TensorBoard's frames, all heads together): `<task>-step<N>-<kind>.png`."""
    from minitfm.lab.attention.mapgrid import MapGrid
    from minitfm.lab.attention.probe import KIND_TITLES, map_blocks
    from minitfm.lab.watch.tb import png_bytes, probe_caption, probe_header

    header = probe_header(task, snapshot.probe.src, snapshot.target)
    caption = probe_caption(task, snapshot.step, snapshot.probe.prediction, snapshot.target)
    return {f"{task.name}-step{snapshot.step}-{block.kind}.png":
            png_bytes(MapGrid(block, f"{KIND_TITLES[block.kind]}\n{header}", caption)
                      .frame(block, caption))
            for block in map_blocks(snapshot.probe, task)}
