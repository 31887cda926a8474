"""MLflow's REST API as minitfm speaks it (lab/watch/mlflow_rest.py), against a stand-in server
the tests run on loopback that keeps every request: MLflow's limits per log-batch, the
credentials and headers of MLflow's variables, the tries again, a server that takes no files.
The calls against a real `mlflow server`, read back through MLflow's own client, are
test_tracker.py's."""

import base64
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from minitfm.lab.watch.mlflow_rest import RestClient, TrackerError, artifact_url, batches
from tests.helpers import QUICK, assert_clean_error, run_cli

NO_WAIT = {"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0"}


class StandIn(BaseHTTPRequestHandler):
    """A stand-in for `mlflow server`: one experiment (made by the first call that asks), runs
    whose files go to `server.artifact_uri`; `server.failures` statuses answered first, one per
    request; every request kept in `server.requests`: method, path, headers, body (JSON read)."""

    def answer(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        body = json.loads(raw) if self.headers.get("Content-Type") == "application/json" else raw
        self.server.requests.append((self.command, self.path, self.headers, body))
        if self.server.failures:
            return self.reply(self.server.failures.pop(0), {"error_code": "TEMPORARILY_UNAVAILABLE",
                                                            "message": "busy"})
        path = self.path.split("?")[0]
        if path.endswith("/experiments/get-by-name") and not self.server.made:
            return self.reply(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no"})
        if path.endswith("/experiments/create"):
            self.server.made = True
        run = {"info": {"run_id": "r1", "experiment_id": "7", "lifecycle_stage": "active",
                        "artifact_uri": self.server.artifact_uri}, "data": {}}
        self.reply(200, {"/api/2.0/mlflow/experiments/get-by-name":
                         {"experiment": {"experiment_id": "7", "lifecycle_stage": "active"}},
                         "/api/2.0/mlflow/experiments/create": {"experiment_id": "7"},
                         "/api/2.0/mlflow/runs/create": {"run": run},
                         "/api/2.0/mlflow/runs/get": {"run": run}}.get(path, {}))

    def reply(self, status: int, answer: dict) -> None:
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = answer

    def log_message(self, *args):
        pass


@contextmanager
def stand_in(artifact_uri: str = "mlflow-artifacts:/7/r1/artifacts", failures=()):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    httpd.requests, httpd.failures, httpd.made = [], list(failures), False
    httpd.artifact_uri = artifact_uri
    # shutdown() waits for the loop to look again: every 10 ms, not its default 0.5 s
    threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_batch_is_cut_at_mlflow_s_limits_and_sends_everything_once(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    metrics = [(f"m{i % 7}", i / 3, 1000 + i, i) for i in range(2500)]
    params = {f"p{i}": str(i) for i in range(150)}
    tags = {f"t{i}": str(i) for i in range(120)}
    with stand_in() as (uri, httpd):
        RestClient(uri).log_batch("r1", metrics, params, tags)
    bodies = [body for _, path, _, body in httpd.requests]
    assert {path for _, path, _, _ in httpd.requests} == {"/api/2.0/mlflow/runs/log-batch"}
    assert len(bodies) == 3  # 100 params, 100 tags, 800 metrics; 50, 20, 930; 770
    for body in bodies:
        assert body["run_id"] == "r1"
        assert len(body["metrics"]) <= 1000 and len(body["params"]) <= 100
        assert len(body["tags"]) <= 100
        assert len(body["metrics"]) + len(body["params"]) + len(body["tags"]) <= 1000
    sent = [(m["key"], m["value"], m["timestamp"], m["step"]) for b in bodies
            for m in b["metrics"]]
    assert sent == metrics  # in order, each once, the values exact
    assert {p["key"]: p["value"] for b in bodies for p in b["params"]} == params
    assert {t["key"]: t["value"] for b in bodies for t in b["tags"]} == tags
    assert sum(len(b["params"]) for b in bodies) == 150 and list(batches([], [], [])) == []


@pytest.mark.parametrize("env, expected", [
    ({"MLFLOW_TRACKING_TOKEN": "tok"}, "Bearer tok"),
    ({"MLFLOW_TRACKING_USERNAME": "ann", "MLFLOW_TRACKING_PASSWORD": "pw",
      "MLFLOW_TRACKING_TOKEN": "tok"}, "Basic " + base64.b64encode(b"ann:pw").decode()),
    ({"MLFLOW_TRACKING_USERNAME": "ann"}, None),  # a user without a password: none, as MLflow
])
def test_credentials_are_mlflow_s_variables(monkeypatch, tmp_path, env, expected):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials of the machine's
    for name in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {**env, "MLFLOW_WORKSPACE": "team"}.items():
        monkeypatch.setenv(name, value)
    with stand_in() as (uri, httpd):
        RestClient(uri).update("r1", "RUNNING")
    [(method, path, headers, body)] = httpd.requests
    assert (method, path) == ("POST", "/api/2.0/mlflow/runs/update")
    assert body == {"run_id": "r1", "run_uuid": "r1", "status": "RUNNING"}  # no end: running
    assert headers.get("Authorization") == expected
    assert headers["X-MLFLOW-WORKSPACE"] == "team"


def test_the_credentials_file_gives_the_user_and_password(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".mlflow").mkdir()
    (tmp_path / ".mlflow" / "credentials").write_text(
        "[mlflow]\nmlflow_tracking_username = bob\nmlflow_tracking_password = s3cret\n")
    with stand_in() as (uri, httpd):
        RestClient(uri).update("r1", "FINISHED")
    [(_, _, headers, body)] = httpd.requests
    assert headers["Authorization"] == "Basic " + base64.b64encode(b"bob:s3cret").decode()
    assert body["status"] == "FINISHED" and body["end_time"] > 0


def test_a_passing_failure_is_tried_again_and_a_run_is_never_made_twice(monkeypatch):
    for name, value in {**NO_WAIT, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3"}.items():
        monkeypatch.setenv(name, value)
    with stand_in(failures=[503, 500]) as (uri, httpd):
        RestClient(uri).log_batch("r1", [("a", 1.0, 1, 1)])  # safe to send again
    assert [path for _, path, _, _ in httpd.requests] == ["/api/2.0/mlflow/runs/log-batch"] * 3
    with stand_in(failures=[503]) as (uri, httpd), pytest.raises(TrackerError) as refused:
        RestClient(uri).create_run("7", "run", {})  # the server may have made it
    assert len(httpd.requests) == 1 and refused.value.code == "TEMPORARILY_UNAVAILABLE"
    with stand_in(failures=[429]) as (uri, httpd):  # 429: it made nothing
        assert RestClient(uri).create_run("7", "run", {"seed": "1"}).run_id == "r1"
    assert len(httpd.requests) == 2 and httpd.requests[1][3]["tags"] == [
        {"key": "seed", "value": "1"}]
    with stand_in(failures=[503] * 4) as (uri, httpd), pytest.raises(TrackerError):
        RestClient(uri).update("r1", "KILLED")
    assert len(httpd.requests) == 4  # the first try and MLFLOW_HTTP_REQUEST_MAX_RETRIES more


def test_files_go_where_the_server_keeps_the_run_s_artifacts(monkeypatch):
    assert artifact_url("http://h:5000", "mlflow-artifacts:/7/r1/artifacts") == \
        "http://h:5000/api/2.0/mlflow-artifacts/artifacts/7/r1/artifacts"
    assert artifact_url("https://h/mlflow/", "mlflow-artifacts://other:81/7/r1/artifacts") == \
        "https://other:81/mlflow/api/2.0/mlflow-artifacts/artifacts/7/r1/artifacts"
    with stand_in() as (uri, httpd):
        client = RestClient(uri)
        run = client.create_run("7", "run", {})
        client.log_files(run, {"a b.png": b"\x89PNG", "c.csv": b"a,b\n"}, "attention")
    puts = [(path, headers["Content-Type"], body) for method, path, headers, body
            in httpd.requests if method == "PUT"]
    assert puts == [("/api/2.0/mlflow-artifacts/artifacts/7/r1/artifacts/attention/a%20b.png",
                     "image/png", b"\x89PNG"),
                    ("/api/2.0/mlflow-artifacts/artifacts/7/r1/artifacts/attention/c.csv",
                     "text/csv", b"a,b\n")]


def test_a_server_that_takes_no_files_is_one_warning_and_the_rest_is_logged(tmp_path):
    run = tmp_path / "run"
    with stand_in(artifact_uri="/srv/mlruns/7/r1/artifacts") as (uri, httpd):
        result = run_cli("train", *QUICK, "log.attention_every=25", f"log.mlflow={uri}",
                         "--run-dir", run)
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: MLflow at {uri} does not take files (the run's go to "
        f"/srv/mlruns/7/r1/artifacts, where only MLflow's client writes): config.yaml, "
        f"summary.json and the attention pictures stay in {run} only; start the server serving "
        f"artifacts (mlflow server does unless --no-serve-artifacts)"], result.stderr
    assert not [r for r in httpd.requests if r[0] == "PUT"]
    paths = [path for _, path, _, _ in httpd.requests]
    assert paths[-1] == "/api/2.0/mlflow/runs/update" and \
        httpd.requests[-1][3]["status"] == "FINISHED"
    logged = {m["key"] for _, path, _, body in httpd.requests
              if path.endswith("/log-batch") for m in body["metrics"]}
    assert {"train/loss", "eval/exact_match", "summary/best_exact_match"} <= logged


@pytest.mark.slow
def test_a_sweep_on_a_server_that_takes_no_files_says_so_once(tmp_path):
    out = tmp_path / "sweep"
    with stand_in(artifact_uri="/srv/mlruns/7/r1/artifacts") as (uri, httpd):
        result = run_cli("sweep", *QUICK, "train.steps=20", "log.tensorboard=false",
                         f"log.mlflow={uri}", "--seeds", "0,1", "--out", out)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stderr.strip() == (
        f"warning: MLflow at {uri} does not take files (the run's go to "
        f"/srv/mlruns/7/r1/artifacts, where only MLflow's client writes): the sweep's files "
        f"stay in {out} only; start the server serving artifacts (mlflow server does unless "
        f"--no-serve-artifacts)")
    assert not [r for r in httpd.requests if r[0] == "PUT"]
    parents = [body["tags"] for _, path, _, body in httpd.requests
               if path.endswith("/runs/create")]
    assert len(parents) == 3 and sum({"key": "mlflow.parentRunId", "value": "r1"} in tags
                                     for tags in parents) == 2  # the sweep's, its two runs'
    ended = [body["status"] for _, path, _, body in httpd.requests
             if path.endswith("/runs/update")]
    assert ended == ["FINISHED"] * 3


def test_a_wrong_mlflow_variable_is_one_line_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "lots")
    with stand_in() as (uri, httpd):
        result = run_cli("train", *QUICK, f"log.mlflow={uri}", "--run-dir", tmp_path / "run")
    assert_clean_error(result, 2, "MLFLOW_HTTP_REQUEST_MAX_RETRIES ('lots') must be a number")
    assert not (tmp_path / "run").exists() and not httpd.requests
