"""MLflow's REST API in the standard library (urllib, json): the calls a run and a sweep make to
a tracking server (http, https), so that neither process imports mlflow, whose import costs a
second or so of CPU, as much as torch's, on a thread beside training's.

`RestClient` mirrors MLflow 3's own client (mlflow/store/tracking/rest_store.py,
mlflow/utils/rest_utils.py, mlflow/store/artifact/http_artifact_repo.py): the same endpoints
and bodies; log-batch cut at MLflow's limits (1000 metrics, 100 params, 100 tags a request);
files sent as a server that serves artifacts takes them (a run whose artifact URI is
`mlflow-artifacts:`: PUT /api/2.0/mlflow-artifacts/artifacts/<path>); the same variables for
credentials (MLFLOW_TRACKING_USERNAME and _PASSWORD, also read from ~/.mlflow/credentials, as
Basic; else MLFLOW_TRACKING_TOKEN as Bearer), TLS (MLFLOW_TRACKING_INSECURE_TLS,
_SERVER_CERT_PATH, _CLIENT_CERT_PATH), the workspace (MLFLOW_WORKSPACE), the timeout and the
retries (MLFLOW_HTTP_REQUEST_TIMEOUT, _MAX_RETRIES, _BACKOFF_FACTOR, _BACKOFF_JITTER: a call
that failed for want of an answer or with a passing status is sent again after 0, 4, 8, ...
120 s; one that would be done twice, a run made, only when the server cannot have done it).
`tracking.client_for` picks this client or MLflow's own, which take the same calls.
"""

from __future__ import annotations

import base64
import configparser
import http.client
import json
import mimetypes
import os
import random
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from minitfm.errors import MinitfmError, quote
from minitfm.version import __version__

API = "/api/2.0/mlflow"
ARTIFACTS = "/api/2.0/mlflow-artifacts/artifacts"  # a server's proxied artifact store
MAX_METRICS, MAX_PARAMS_TAGS, MAX_ENTITIES = 1000, 100, 1000  # a log-batch's limits
TRANSIENT = frozenset({408, 429, 500, 502, 503, 504})  # statuses MLflow's client sends again
UNPROCESSED = frozenset({408, 429})  # ... the ones that say the call was not done
BACKOFF_MAX_S = 120.0  # the longest wait between two tries (urllib3's, as MLflow's client)
GONE = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")  # no such run on this tracker
PLUGINS = ("MLFLOW_TRACKING_AUTH", "MLFLOW_TRACKING_AWS_SIGV4")  # MLflow's client's alone


@dataclass(frozen=True)
class Found:
    """An MLflow run, as minitfm uses it: where its files go, its params, whether deleted."""
    run_id: str
    experiment_id: str
    artifact_uri: str
    params: dict[str, str]
    active: bool


class TrackerError(Exception):
    """A call the tracker refused or did not answer; `code` is MLflow's error code
    (RESOURCE_DOES_NOT_EXIST, ...), else the HTTP status, else empty."""

    def __init__(self, text: str, code: str = ""):
        super().__init__(text)
        self.code = code


@dataclass(frozen=True)
class Settings:
    """How to reach a server, from MLflow's variables (see the module docstring)."""
    headers: dict[str, str]
    context: ssl.SSLContext | None
    timeout: float
    retries: int
    backoff: float
    jitter: float


def speaks_rest(uri: str) -> bool:
    """Whether `RestClient` takes the tracker at `uri`: a server (http, https) reached without
    one of MLflow's auth plugins (PLUGINS, which only MLflow's client has)."""
    return uri.lower().startswith(("http://", "https://")) and \
        not any(flag(name) for name in PLUGINS)


def read_settings() -> Settings:
    """MLflow's variables as `RestClient` uses them; a MinitfmError for a value it refuses."""
    headers = {"User-Agent": f"minitfm/{__version__}"}
    username, password = credentials()
    if username and password:
        pair = base64.standard_b64encode(f"{username}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    elif token := os.environ.get("MLFLOW_TRACKING_TOKEN"):
        headers["Authorization"] = f"Bearer {token}"
    if workspace := os.environ.get("MLFLOW_WORKSPACE", "").strip():
        headers["X-MLFLOW-WORKSPACE"] = workspace
    return Settings(headers, tls_context(), number("MLFLOW_HTTP_REQUEST_TIMEOUT", 120),
                    int(number("MLFLOW_HTTP_REQUEST_MAX_RETRIES", 7)),
                    number("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", 2),
                    number("MLFLOW_HTTP_REQUEST_BACKOFF_JITTER", 1.0))


def credentials() -> tuple[str | None, str | None]:
    """MLFLOW_TRACKING_USERNAME and _PASSWORD, each from the environment, else from the
    [mlflow] section of ~/.mlflow/credentials (as MLflow reads them)."""
    saved = configparser.ConfigParser()
    try:
        saved.read(Path("~/.mlflow/credentials").expanduser(), encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as err:
        raise MinitfmError(f"~/.mlflow/credentials cannot be read ({err}): fix or remove "
                           f"it") from None
    section = saved["mlflow"] if saved.has_section("mlflow") else {}
    return tuple(os.environ.get(name) or section.get(name.lower())
                 for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"))


def tls_context() -> ssl.SSLContext | None:
    """The TLS of https: verified (against MLFLOW_TRACKING_SERVER_CERT_PATH, a CA bundle, if
    set), or not at all with MLFLOW_TRACKING_INSECURE_TLS; MLFLOW_TRACKING_CLIENT_CERT_PATH, a
    file with the client's certificate and key. None: Python's default."""
    insecure = flag("MLFLOW_TRACKING_INSECURE_TLS")
    server, client = (os.environ.get(f"MLFLOW_TRACKING_{kind}_CERT_PATH")
                      for kind in ("SERVER", "CLIENT"))
    if insecure and server:
        raise MinitfmError("MLFLOW_TRACKING_INSECURE_TLS and MLFLOW_TRACKING_SERVER_CERT_PATH "
                           "are both set: unset one")
    if not (insecure or server or client):
        return None
    try:
        context = ssl.create_default_context(cafile=server or None)
        if insecure:
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        if client:
            context.load_cert_chain(client)
    except (OSError, ssl.SSLError) as err:
        raise MinitfmError(f"the certificates MLFLOW_TRACKING_*_CERT_PATH names cannot be "
                           f"used ({err}): fix the paths") from None
    return context


def flag(name: str) -> bool:
    """A variable MLflow reads as true or false (true, false, 1, 0; unset: false)."""
    value = os.environ.get(name, "").strip().lower()
    if value not in ("", "true", "false", "1", "0"):
        raise MinitfmError(f"{name} ({quote(value)}) must be true or false")
    return value in ("true", "1")


def number(name: str, default: float) -> float:
    """A variable that holds a number of at least 0 (unset: `default`)."""
    value = os.environ.get(name, "").strip()
    try:
        found = float(value) if value else default
    except ValueError:
        found = -1
    if not found >= 0:
        raise MinitfmError(f"{name} ({quote(value)}) must be a number of at least 0")
    return found


class RestClient:
    """The calls minitfm makes to the MLflow server at `uri`, over its REST API (see the module
    docstring); each raises a TrackerError when the server refuses it or does not answer."""

    def __init__(self, uri: str):
        self.base, self.settings = uri.rstrip("/"), read_settings()
        handlers = [urllib.request.HTTPSHandler(context=self.settings.context)] \
            if self.settings.context else []
        self.opener = urllib.request.build_opener(*handlers)

    def experiment(self, name: str) -> tuple[str, str] | None:
        """The experiment `name`'s id and lifecycle stage (active, deleted); None if none."""
        try:
            found = self.call("GET", f"{API}/experiments/get-by-name",
                              query={"experiment_name": name})["experiment"]
        except TrackerError as err:
            if err.code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise
        return found["experiment_id"], found.get("lifecycle_stage", "active")

    def create_experiment(self, name: str) -> str | None:
        """A new experiment's id; None when one of that name is there already."""
        try:
            return self.call("POST", f"{API}/experiments/create", {"name": name},
                             safe=False)["experiment_id"]
        except TrackerError as err:
            if err.code == "RESOURCE_ALREADY_EXISTS":
                return None
            raise

    def run(self, run_id: str) -> Found | None:
        """The run `run_id`; None when the tracker has none of that id."""
        try:
            answer = self.call("GET", f"{API}/runs/get",
                               query={"run_uuid": run_id, "run_id": run_id})
        except TrackerError as err:
            if err.code in GONE:
                return None
            raise
        return found(answer["run"])

    def create_run(self, experiment_id: str, name: str, tags: dict[str, str]) -> Found:
        """A new run, RUNNING since now (as MLflow's client: user `unknown`)."""
        body = {"experiment_id": experiment_id, "user_id": tags.get("mlflow.user", "unknown"),
                "start_time": now_ms(), "tags": pairs(tags), "run_name": name}
        return found(self.call("POST", f"{API}/runs/create", body, safe=False)["run"])

    def update(self, run_id: str, status: str) -> None:
        """The run's status (RUNNING, FINISHED, KILLED, FAILED); an end time if it ended."""
        body: dict[str, Any] = {"run_id": run_id, "run_uuid": run_id, "status": status}
        if status != "RUNNING":
            body["end_time"] = now_ms()
        self.call("POST", f"{API}/runs/update", body)

    def log_batch(self, run_id: str, metrics: list[tuple[str, float, int, int]] = (),
                  params: dict[str, str] | None = None,
                  tags: dict[str, str] | None = None) -> None:
        """Metrics as (key, value, timestamp in ms, step), params and tags, in as many
        log-batch calls as MLflow's limits take (`batches`)."""
        for some_metrics, some_params, some_tags in batches(list(metrics), pairs(params or {}),
                                                            pairs(tags or {})):
            self.call("POST", f"{API}/runs/log-batch", {
                "run_id": run_id, "params": some_params, "tags": some_tags,
                "metrics": [{"key": key, "value": value, "timestamp": stamp, "step": step}
                            for key, value, stamp, step in some_metrics]})

    def serves_files(self, run: Found) -> bool:
        """Whether the run's files go through the server (it serves artifacts)."""
        return run.artifact_uri.startswith("mlflow-artifacts:")

    def log_files(self, run: Found, files: dict[str, bytes], folder: str = "") -> None:
        """Files by name, into `folder` of the run's artifacts (see `serves_files`)."""
        where = artifact_url(self.base, run.artifact_uri)
        for name, data in files.items():
            path = urllib.parse.quote("/".join(part for part in (folder, name) if part))
            kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
            self.tried("PUT", f"{where}/{path}", data, kind, safe=True)

    def call(self, method: str, endpoint: str, body: dict | None = None, *,
             query: dict | None = None, safe: bool = True) -> dict[str, Any]:
        """The answer to a call of the API at `endpoint` (a path on the server) with `body` as
        JSON, or `query`; `safe`: the call may be done twice (a read, a log-batch, which the
        server does once)."""
        url = self.base + endpoint + (f"?{urlencode(query)}" if query else "")
        data = json.dumps(body).encode("utf-8") if body is not None else None
        return self.tried(method, url, data, "application/json", safe)

    def tried(self, method: str, url: str, data: bytes | None, kind: str,
              safe: bool) -> dict[str, Any]:
        """The answer to `data` sent to `url` as `kind`, as JSON ({} when empty), tried again
        as MLflow's client does (see the module docstring and `call`)."""
        endpoint = urlsplit(url).path
        retried, failures = (TRANSIENT if safe else UNPROCESSED), 0
        while True:
            last, wait = failures == self.settings.retries, None
            try:
                return self.send(method, url, data, kind)
            except urllib.error.HTTPError as err:
                failure = refusal(method, endpoint, err)
                wait = retry_after(err)
                if err.code not in retried or last:
                    raise failure from None
            except urllib.error.URLError as err:  # not connected, or the call not sent whole
                if last:
                    raise TrackerError(f"{method} {endpoint}: {reason(err.reason)}") from None
            except (OSError, http.client.HTTPException) as err:  # the answer cut: done or not
                if not safe or last:
                    raise TrackerError(f"{method} {endpoint}: {reason(err)}") from None
            failures += 1
            time.sleep(wait if wait is not None else self.backoff(failures))

    def send(self, method: str, url: str, data: bytes | None, kind: str) -> dict[str, Any]:
        headers = {**self.settings.headers, **({"Content-Type": kind} if data else {})}
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        with self.opener.open(request, timeout=self.settings.timeout) as answer:
            text = answer.read()
        return json.loads(text) if text.strip() else {}

    def backoff(self, errors: int) -> float:
        """The wait after `errors` failed tries in a row: none after the first, then factor *
        2^(errors-1) and a random jitter, at most BACKOFF_MAX_S (urllib3's Retry)."""
        if errors <= 1:
            return 0.0
        wait = self.settings.backoff * 2 ** (errors - 1) + random.random() * self.settings.jitter
        return min(BACKOFF_MAX_S, wait)


def batches(metrics: list, params: list, tags: list):
    """The log-batch calls MLflow's client makes of them: params and tags 100 at a time, with
    as many metrics as 1000 entities in all leave, then metrics 1000 at a time."""
    while params or tags or metrics:
        some_params, params = params[:MAX_PARAMS_TAGS], params[MAX_PARAMS_TAGS:]
        some_tags, tags = tags[:MAX_PARAMS_TAGS], tags[MAX_PARAMS_TAGS:]
        room = min(MAX_METRICS, MAX_ENTITIES - len(some_params) - len(some_tags))
        some_metrics, metrics = metrics[:room], metrics[room:]
        yield some_metrics, some_params, some_tags


def found(run: dict[str, Any]) -> Found:
    """A run as the REST API answers it."""
    info, data = run["info"], run.get("data", {})
    return Found(info["run_id"], info["experiment_id"], info.get("artifact_uri", ""),
                 {p["key"]: p.get("value", "") for p in data.get("params", [])},
                 info.get("lifecycle_stage", "active") == "active")


def artifact_url(tracking: str, artifact_uri: str) -> str:
    """Where a server that serves artifacts takes a run's files: its artifact URI
    (`mlflow-artifacts:/1/<run>/artifacts`) under ARTIFACTS on the tracking server, or on the
    host the URI names (MlflowArtifactsRepository.resolve_uri)."""
    server, where = urlsplit(tracking), urlsplit(artifact_uri)
    path = re.sub(r"//+", "/", f"{server.path}/{ARTIFACTS}/{where.path}").rstrip("/")
    return urlunsplit((server.scheme, where.netloc or server.netloc, path, "", ""))


def refusal(method: str, endpoint: str, err: urllib.error.HTTPError) -> TrackerError:
    """The server's answer to a failed call, in a TrackerError: MLflow's error code and
    message where it sent them, else the status and the first of its text."""
    with err:
        text = err.read(2000).decode("utf-8", "replace")
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and "error_code" in answer:
        return TrackerError(f"{method} {endpoint}: {answer['error_code']}: "
                            f"{answer.get('message', '')}", str(answer["error_code"]))
    detail = " ".join(text.split())[:120]
    return TrackerError(f"{method} {endpoint}: HTTP {err.code}" + (f" ({detail})" if detail
                                                                    else ""), str(err.code))


def retry_after(err: urllib.error.HTTPError) -> float | None:
    """The seconds a 413, 429 or 503 answer's Retry-After asks to wait, if it says."""
    value = err.headers.get("Retry-After", "") if err.headers else ""
    return float(value) if err.code in (413, 429, 503) and value.strip().isdigit() else None


def reason(err: object) -> str:
    """Why a connection failed, in words (`Connection refused`, `timed out`)."""
    text = getattr(err, "strerror", None) or str(err)
    return text or type(err).__name__


def pairs(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": key, "value": value} for key, value in values.items()]


def now_ms() -> int:
    return int(time.time() * 1000)
