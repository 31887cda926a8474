"""log.mlflow: runs and sweeps in MLflow (lab/watch/tracker.py, tracking.py), against a real
tracking server the tests start on loopback (`mlflow server` with a SQLite store), read back
through MLflow's client; a tracker that does not answer, that is missing, or that fails while
the run trains."""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import pytest
import yaml

from minitfm.config import flatten, load_config
from minitfm.lab.many.runs import changed_keys
from minitfm.lab.watch import tracking
from minitfm.lab.watch.tracker import line_end, metric_values, read_lines
from minitfm.run.rundir import clear_made_files
from tests.helpers import QUICK, TINY, assert_clean_error, missing, once, run_cli

SERVER_START_S = 240  # a loaded 2-core machine took ~30 s to bring the server up
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true"}  # no usage data sent from the tests' MLflow


def needs_mlflow() -> None:
    if find_spec("mlflow") is None:
        missing("MLflow is not installed (pip install -e '.[mlflow]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(folder: Path):
    """`mlflow server` on a free loopback port with a SQLite store under `folder`, in a process
    group of its own (its workers too); its URI once it answers; the group stopped at the end."""
    needs_mlflow()
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (folder / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
         f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, **QUIET})
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while tracking.unanswered(uri) is not None:
            assert proc.poll() is None, (folder / "server.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "mlflow server did not answer"
            time.sleep(0.5)
        yield uri, proc
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the server's process group by its PID: it and its workers (a job runner, a queue
    consumer), which may outlive it a while after SIGTERM."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):  # the whole group is gone
            os.killpg(proc.pid, signum)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(5)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as (uri, _):
        yield uri


@pytest.fixture
def experiment(monkeypatch, request):
    """An experiment of the test's own (MLFLOW_EXPERIMENT_NAME, which the runs' processes
    inherit), and MLflow's client."""
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", request.node.name)
    for key, value in QUIET.items():
        monkeypatch.setenv(key, value)
    return request.node.name


def client_of(uri):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def runs_of(client, name: str) -> list:
    found = client.get_experiment_by_name(name)
    return client.search_runs([found.experiment_id]) if found else []


def expected_metrics(run_dir: Path) -> set[tuple[str, int, float]]:
    """Every number of metrics.jsonl, as (name, step, value), read here from the file: a
    record's split and key, a dict's keys after it (the forecast)."""
    found = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            items = value.items() if isinstance(value, dict) else [("", value)]
            for sub, item in items:
                if key in ("step", "split") or isinstance(item, bool) or \
                        not isinstance(item, (int, float)):
                    continue
                name = f"{record['split']}/{key}" + (f"/{sub}" if sub else "")
                found.add((name, record["step"], float(item)))
    return found


def logged_metrics(client, run_id: str) -> set[tuple[str, int, float]]:
    """Every metric point of the MLflow run but the summary's, as (name, step, value)."""
    names = [name for name in client.get_run(run_id).data.metrics
             if not name.startswith("summary/")]
    points = [(name, m.step, m.value) for name in names
              for m in client.get_metric_history(run_id, name)]
    assert len(points) == len(set(points)), "a point logged twice"
    return set(points)


def run_id_of(folder: Path) -> str:
    return json.loads((folder / "mlflow.json").read_text())["run_id"]


# --- without a server ---

def test_a_record_s_numbers_are_metrics_named_by_split_and_key():
    record = {"step": 30, "split": "gauges", "exact": 0.25, "positions": [0.7, 0.5],
              "heads": [[0.3]], "align": None, "flag": True, "note": "text",
              "forecast": {"click_step": 150, "end_exact": 0.99, "words": "on course"},
              "weird:name": 1.0, "inf": math.inf}
    assert metric_values(record) == {"gauges/exact": 0.25, "gauges/forecast/click_step": 150.0,
                                     "gauges/forecast/end_exact": 0.99}
    assert metric_values({"step": 5, "split": "train", "loss": 1.5}) == {"train/loss": 1.5}
    assert metric_values({"split": "eval", "loss": 1.0}) == {}  # no step: no record of ours


def test_metrics_jsonl_is_read_in_whole_lines_from_where_the_last_read_ended(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2}\n{"ste')  # the last line still being written
    lines, offset = read_lines(path, 0)
    assert lines == [b'{"step": 1}', b'{"step": 2}'] and offset == 24
    with path.open("ab") as f:
        f.write(b'p": 3}\n')
    assert read_lines(path, offset) == ([b'{"step": 3}'], 36)
    assert line_end(path, 2) == (24, 2)
    assert line_end(path, 9) == (36, 3)  # a resume keeps fewer lines than were sent
    assert line_end(tmp_path / "none.jsonl", 4) == (0, 0)


@pytest.mark.parametrize("value, needle", [
    ("5000", "log.mlflow (5000) must be a tracking URI"),
    ("localhost", "log.mlflow ('localhost') must be a tracking URI"),
])
def test_log_mlflow_is_a_uri_true_or_null(value, needle):
    assert_clean_error(run_cli("train", f"log.mlflow={value}", "--print-config"), 2, needle)


def test_log_mlflow_true_without_mlflow_tracking_uri_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = run_cli("train", *QUICK, "log.mlflow=true", "--run-dir", tmp_path / "run")
    assert_clean_error(result, 2, "MLFLOW_TRACKING_URI, and that is not set")
    assert not (tmp_path / "run").exists()


def test_a_tracker_that_does_not_answer_is_one_line_before_anything_is_written(tmp_path):
    needs_mlflow()
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_cli("train", *QUICK, f"log.mlflow={uri}", "--run-dir", tmp_path / "run")
    assert_clean_error(result, 2, f"no MLflow tracking server answers at '{uri}'",
                       "log.mlflow=null")
    assert not (tmp_path / "run").exists()
    result = run_cli("sweep", *QUICK, "--seeds", "0,1", f"log.mlflow={uri}", "--out",
                     tmp_path / "sweep")
    assert_clean_error(result, 2, f"no MLflow tracking server answers at '{uri}'")
    assert not (tmp_path / "sweep").exists()


def test_a_sweep_logs_to_one_tracker(tmp_path):
    result = run_cli("sweep", *QUICK, "log.mlflow=sqlite:///a.db,sqlite:///b.db", "--out",
                     tmp_path / "sweep")
    assert_clean_error(result, 2, "log.mlflow takes one value in a sweep")
    assert not (tmp_path / "sweep").exists()


def test_mlflow_not_installed_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking, "find_spec", lambda name: None)
    result = run_cli("train", *QUICK, "log.mlflow=http://127.0.0.1:5000", "--run-dir",
                     tmp_path / "run")
    assert_clean_error(result, 2, "pip install 'minitfm[mlflow]'")
    assert not (tmp_path / "run").exists()


def test_an_overwritten_run_forgets_its_mlflow_run(tmp_path):
    (tmp_path / "mlflow.json").write_text('{"run_id": "abc", "lines": 3}\n')
    (tmp_path / "mine.json").write_text("{}")
    clear_made_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]


def test_where_a_run_is_watched_is_no_difference_between_runs():
    watched = load_config(None, [("log.mlflow", "http://127.0.0.1:5000"), ("seed", 2)])
    assert changed_keys(watched.model_dump()) == {"seed": 2}  # `minitfm runs`, plot, compare


class Refusing(BaseHTTPRequestHandler):
    """A server that answers /health and fails every call of MLflow's API."""

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 500)
        self.end_headers()
        self.wfile.write(b"OK")

    do_POST = do_PATCH = do_PUT = do_GET

    def log_message(self, *args):
        pass


def test_a_tracker_that_fails_while_the_run_trains_is_one_warning_and_the_run_finishes(
        tmp_path, monkeypatch):
    needs_mlflow()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # fail at once, not in minutes
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    # shutdown() waits for the loop to look again: every 10 ms, not its default 0.5 s
    threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{httpd.server_address[1]}"
        run = tmp_path / "run"
        result = run_cli("train", *QUICK, "log.log_every=5", f"log.mlflow={uri}", "--run-dir",
                         run)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1, result.stderr
    assert warnings[0].startswith(f"warning: MLflow at {uri} stopped taking this run's records")
    assert "the run goes on without it" in warnings[0]
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 50


# --- against a real MLflow server ---

@pytest.mark.slow
def test_a_run_logs_its_config_tags_every_number_of_metrics_jsonl_and_its_files(
        server, experiment, tmp_path):
    run = tmp_path / "run"
    result = run_cli("train", *QUICK, "seed=3", "log.attention_every=25", f"log.mlflow={server}",
                     "--run-dir", run)
    assert result.exit_code == 0, result.stderr
    assert "warning" not in result.stderr
    client = client_of(server)
    [logged] = runs_of(client, experiment)
    assert logged.info.run_id == run_id_of(run) and logged.info.run_name == "run"
    assert logged.info.status == "FINISHED" and logged.info.end_time
    config = flatten(yaml.safe_load((run / "config.yaml").read_text()))
    assert logged.data.params == {key: value if isinstance(value, str) else json.dumps(value)
                                  for key, value in config.items()}
    assert logged.data.params["train.lr"] == "0.01" and logged.data.params["seed"] == "3"
    tags = logged.data.tags
    assert (tags["seed"], tags["task"], tags["status"]) == ("3", "copy", "finished")
    assert logged_metrics(client, logged.info.run_id) == expected_metrics(run)
    summary = json.loads((run / "summary.json").read_text())
    assert logged.data.metrics["summary/best_exact_match"] == summary["best_exact_match"]
    names = {f.path for f in client.list_artifacts(logged.info.run_id)} | \
        {f.path for f in client.list_artifacts(logged.info.run_id, "attention")}
    assert names == {"config.yaml", "summary.json", "attention",
                     *(f"attention/copy-step50-{kind}.png"
                       for kind in ("encoder", "decoder", "cross"))}
    local = Path(client.download_artifacts(logged.info.run_id, "", str(tmp_path / "back")))
    assert (local / "config.yaml").read_bytes() == (run / "config.yaml").read_bytes()
    assert (local / "attention" / "copy-step50-cross.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_resumed_run_continues_its_mlflow_run(server, experiment, tmp_path):
    run = tmp_path / "run"
    first = run_cli("train", *QUICK, "train.steps=30", f"log.mlflow={server}", "--run-dir", run)
    assert first.exit_code == 0, first.stderr
    again = run_cli("train", "--resume", run, "train.steps=50")
    assert again.exit_code == 0, again.stderr
    client = client_of(server)
    [logged] = runs_of(client, experiment)  # the same run, not a second one
    assert logged.info.run_id == run_id_of(run) and logged.info.status == "FINISHED"
    assert logged.data.tags["resumed.train.steps"] == "50"
    assert logged.data.params["train.steps"] == "30"  # a param never changes in MLflow
    assert logged_metrics(client, logged.info.run_id) == expected_metrics(run)
    steps = [m.step for m in client.get_metric_history(logged.info.run_id, "train/loss")]
    assert sorted(steps) == list(range(10, 51, 10))
    assert json.loads((run / "mlflow.json").read_text())["lines"] == \
        len((run / "metrics.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_a_sweep_is_one_parent_run_with_its_runs_as_children(server, experiment, tmp_path):
    out = tmp_path / "sweep"
    grid = ["train.lr=0.003,0.01", "--seeds", "0,1"]
    fast = [*TINY, "train.steps=20", "train.eval_every=0", "log.tensorboard=false",
            f"log.mlflow={server}"]
    result = run_cli("sweep", *fast, *grid, "--out", out, "--eval-samples", "50")
    assert result.exit_code == 0, result.stdout + result.stderr
    client = client_of(server)
    parent_id = run_id_of(out)
    parent = client.get_run(parent_id)
    assert parent.info.run_name == "sweep" and parent.info.status == "FINISHED"
    assert parent.data.tags["swept.train.lr"] == "0.003,0.01"
    assert {"sweep.json", "results.csv", "results.jsonl"} <= \
        {f.path for f in client.list_artifacts(parent_id)}
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent_id}'")
    assert sorted(r.info.run_name for r in children) == [p.name for p in folders]  # 4
    for child, folder in zip(sorted(children, key=lambda r: r.info.run_name), folders):
        assert child.info.run_id == run_id_of(folder) and child.info.status == "FINISHED"
        assert logged_metrics(client, child.info.run_id) == expected_metrics(folder)
    # a search by a param finds exactly the runs that have it
    slow_lr = {run_id_of(f) for f in folders
               if yaml.safe_load((f / "config.yaml").read_text())["train"]["lr"] == 0.003}
    found = client.search_runs([parent.info.experiment_id], "params.`train.lr` = '0.003'")
    assert len(slow_lr) == 2 and {r.info.run_id for r in found} == slow_lr
    # the same command again: the same parent, no run added
    again = run_cli("sweep", *fast, *grid, "--out", out, "--eval-samples", "50")
    assert again.exit_code == 0 and "4 already done" in again.stdout
    assert run_id_of(out) == parent_id and len(runs_of(client, experiment)) == 5


@pytest.mark.slow
def test_a_local_store_takes_the_same_run_through_mlflow_s_client(experiment, tmp_path,
                                                                  monkeypatch):
    needs_mlflow()
    monkeypatch.chdir(tmp_path)  # the store's files go to ./mlruns
    store, run = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    first = run_cli("train", *QUICK, "train.steps=30", "log.attention_every=25",
                    f"log.mlflow={store}", "--run-dir", run)
    again = run_cli("train", "--resume", run, "train.steps=50")  # continues the run there too
    for result in (first, again):
        assert result.exit_code == 0 and "warning: MLflow" not in result.stderr, result.stderr
    client = client_of(store)
    [logged] = runs_of(client, experiment)
    assert logged.info.run_id == run_id_of(run) and logged.info.status == "FINISHED"
    assert logged.data.tags["resumed.train.steps"] == "50" and logged.data.tags["task"] == "copy"
    assert logged_metrics(client, logged.info.run_id) == expected_metrics(run)
    names = {f.path for f in client.list_artifacts(logged.info.run_id, "attention")}
    assert names == {f"attention/copy-step{step}-{kind}.png" for step in (30, 50)
                     for kind in ("encoder", "decoder", "cross")}  # each run's last snapshot
    local = Path(client.download_artifacts(logged.info.run_id, "", str(tmp_path / "back")))
    assert (local / "summary.json").read_bytes() == (run / "summary.json").read_bytes()


# Put first on a Python's path (PYTHONPATH), this sitecustomize records, as the process ends
# (`minitfm`'s exit runs the atexit handlers), its command line and the mlflow modules it holds.
WATCH_IMPORTS = """import atexit, json, os, sys

def record():
    held = sorted(name for name in sys.modules if name.split(".")[0] == "mlflow")
    with open(os.path.join(os.environ["IMPORTS_SEEN"], f"{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.orig_argv, "mlflow": held}, f)

atexit.register(record)
"""


@pytest.mark.slow
def test_a_run_and_a_sweep_that_log_to_a_server_never_import_mlflow(server, experiment, tmp_path):
    """MLflow's import costs a second or so of CPU beside training: a server is spoken to over
    its REST API, in the run's process and in the sweep's, which hold no mlflow module."""
    hook, seen = tmp_path / "hook", tmp_path / "seen"
    hook.mkdir()
    seen.mkdir()
    (hook / "sitecustomize.py").write_text(WATCH_IMPORTS)
    path = [str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, **QUIET, "IMPORTS_SEEN": str(seen), "PYTHONPATH": os.pathsep.join(path)}
    fast = [*TINY, "train.steps=20", "train.eval_every=10", "log.tensorboard=false",
            "log.attention_every=10", f"log.mlflow={server}"]
    for command in (["train", *once(fast), "--run-dir", str(tmp_path / "run")],
                    ["sweep", *once(fast), "--seeds", "0,1", "--out", str(tmp_path / "sweep")]):
        done = subprocess.run([sys.executable, "-m", "minitfm", *command], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    processes = [json.loads(path.read_text()) for path in seen.iterdir()]
    commands = [" ".join(p["argv"]) for p in processes]
    assert len(processes) >= 3, commands  # train, the sweep and its runs' (1 or 2)
    assert sum(" train " in c for c in commands) >= 1 and sum(" sweep " in c for c in commands) == 1
    assert [p["mlflow"] for p in processes] == [[]] * len(processes), commands
    client = client_of(server)  # and they logged: a run, a sweep and its two runs, with files
    runs = runs_of(client, experiment)
    children = [p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert sorted(r.info.run_name for r in runs) == sorted(["run", "sweep", *children]) and \
        len(children) == 2 and {r.info.status for r in runs} == {"FINISHED"}
    for logged in runs:
        assert client.list_artifacts(logged.info.run_id), logged.info.run_name


@pytest.mark.slow
def test_a_server_killed_mid_run_leaves_the_run_to_finish_with_one_warning(tmp_path):
    run = tmp_path / "run"
    with mlflow_server(tmp_path / "server") as (uri, server_proc):
        train = subprocess.Popen(
            [sys.executable, "-m", "minitfm", "train",
             *once([*TINY, "train.steps=1000", "train.target_exact_match=null",
                    "train.eval_every=0", "log.log_every=100", "log.gauge_every=100",
                    "log.tensorboard=false", f"log.mlflow={uri}"]), "--run-dir", str(run)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **QUIET})
        deadline = time.monotonic() + 120
        while not (run / "mlflow.json").is_file():  # the tracker opened its MLflow run
            assert train.poll() is None and time.monotonic() < deadline, train.communicate()
            time.sleep(0.2)
        assert not (run / "summary.json").exists(), "the run ended before the server was killed"
        stop_group(server_proc)
        assert tracking.unanswered(uri) is not None  # the server is gone: nothing answers
        out, err = train.communicate(timeout=600)
    assert train.returncode == 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: MLflow at {uri} "), err
    assert "metrics.jsonl" in lines[0]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records if r["split"] == "train") == 1000
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
