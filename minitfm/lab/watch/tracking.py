"""MLflow below the instrument (`tracker.py`): which tracker log.mlflow names and whether it
answers (`check_tracker`: before a run or sweep writes anything), the client that talks to it
(`client_for`: the REST one of `mlflow_rest.py` for a server, else MLflow's own,
`LibraryClient`, with the same calls), the runs it keeps (an experiment found or made, a run
found again), the `mlflow.json` that ties a run or sweep folder to its MLflow run, and a sweep's
own MLflow run, the parent of its runs' (`SweepRun`). `LibraryClient` is the one importer of
mlflow, lazily: a run pays for that import (a second or so of CPU, on the tracker's thread,
beside training's) only when it logs to a local store (sqlite:, file:) or through MLflow's auth
plugins; a run or sweep that logs to a server never imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from minitfm.config import Config
from minitfm.errors import Interrupted, MinitfmError, quote
from minitfm.lab.watch.mlflow_rest import GONE, Found, RestClient, read_settings, speaks_rest
from minitfm.run.files import to_json, write_atomic
from minitfm.run.summary import read_small

PARENT_ENV = "MINITFM_MLFLOW_PARENT_RUN"  # the id of the MLflow run a run nests under (a sweep's)
RECORD = "mlflow.json"  # in a run (or sweep) folder: its MLflow run
RECORD_BYTES = 4096  # mlflow.json is a few dozen bytes: anything larger is not ours
CHECK_S = 5.0  # seconds a tracking server has to answer before a run starts
INSTALL = "pip install 'minitfm[mlflow]'"
ANSWER_S = 10.0  # seconds a sweep waits for the tracker to open or end its run


def tracking_uri(setting: bool | str | None) -> str | None:
    """The tracker log.mlflow names: a URI as given, true the one in MLFLOW_TRACKING_URI; None
    when off."""
    if setting is None or setting is False:
        return None
    if setting is True:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if not uri:
            raise MinitfmError("log.mlflow is true, which takes the tracker from "
                               "MLFLOW_TRACKING_URI, and that is not set: set it, or give the "
                               "URI, as in log.mlflow=http://127.0.0.1:5000")
        return uri
    return setting


def check_tracker(uri: str) -> None:
    """MLflow is installed and, for a tracking server (http, https), the server answers within
    CHECK_S seconds; else a MinitfmError. A local store (sqlite:, file:) is made by MLflow."""
    if find_spec("mlflow") is None:
        raise MinitfmError(f"log.mlflow ({quote(uri)}) needs MLflow, which is not installed: "
                           f"{INSTALL}, or set log.mlflow=null")
    if not uri.lower().startswith(("http://", "https://")):
        return
    if speaks_rest(uri):
        read_settings()  # MLflow's variables, refused here if wrong, not on the thread
    why = unanswered(uri)
    if why is not None:
        raise MinitfmError(f"no MLflow tracking server answers at {quote(uri)} ({why}): start "
                           f"one (mlflow server --port 5000), fix log.mlflow, or set "
                           f"log.mlflow=null")


def unanswered(uri: str) -> str | None:
    """Why the server at `uri` does not answer a GET of its /health within CHECK_S seconds; None
    when it answers, with any status (whether it takes our runs is the client's to find)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # answers at all: no data
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=CHECK_S,
                                    context=context):
            return None
    except urllib.error.HTTPError:
        return None
    except urllib.error.URLError as err:
        return str(getattr(err.reason, "strerror", None) or err.reason)
    except (OSError, ValueError) as err:  # a timeout while reading; a URL with no host
        return str(err) or type(err).__name__


def param_text(value: Any) -> str:
    """A config value as an MLflow param: text as it is, anything else as YAML writes it
    (`0.01`, `true`, `null`, `[17, 32]`)."""
    return value if isinstance(value, str) else json.dumps(value)


def brief(err: BaseException) -> str:
    """An error in a line: its kind and its message's first line, cut at 160 characters."""
    text = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= 160 else text[:159] + "…"


class SweepRun:
    """A sweep's own MLflow run, the parent of its runs' (see `sweep.run_sweep`): found again
    through the sweep folder's mlflow.json, else made, as the sweep starts; ended as it ends,
    with the folder's own files (sweep.json, results, configurations, pictures) as artifacts."""

    def __init__(self, uri: str, experiment: str):
        self.uri, self.experiment = uri, experiment
        self.client = self.run = self.run_id = None
        self.unserved: str | None = None  # why the files did not go (`unserved`), if so

    @classmethod
    def of(cls, configs: list[Config]) -> SweepRun | None:
        """The tracker the runs log to, checked (see `check_tracker`); None when none."""
        uris = {tracking_uri(cfg.log.mlflow) for cfg in configs}
        if len(uris) > 1:
            raise MinitfmError("log.mlflow takes one value in a sweep (its runs nest under the "
                               "sweep's one MLflow run): set it for every run, not swept")
        uri = uris.pop()
        if uri is None:
            return None
        check_tracker(uri)
        return cls(uri, os.environ.get("MLFLOW_EXPERIMENT_NAME") or configs[0].name)

    @contextlib.contextmanager
    def watching(self, folder: Path, base: dict[str, Any], swept: list,
                 warn: Callable[[str], None]) -> Iterator[dict[str, str]]:
        """The sweep's run, open for the block, which gets the environment its runs' processes
        take (PARENT_ENV); ended as the block ends: FINISHED, KILLED by a signal (an
        Interrupted), else FAILED."""
        failure = within(ANSWER_S, lambda: self.open(folder, base, swept))
        if failure is not None:
            raise MinitfmError(f"MLflow at {self.uri} could not open the sweep's run "
                               f"({failure}): check the tracker, or set log.mlflow=null")
        status = "FAILED"
        try:
            yield {PARENT_ENV: self.run_id}
            status = "FINISHED"
        except Interrupted:
            status = "KILLED"
            raise
        finally:
            failure = within(ANSWER_S, lambda: self.close(folder, status))
            if self.unserved is not None:
                warn(self.unserved)
            if failure is not None:
                warn(f"MLflow at {self.uri} did not take the end of the sweep's run "
                     f"({failure}): its runs and results are in {folder}")

    def open(self, folder: Path, base: dict[str, Any], swept: list) -> None:
        """The run of the folder's mlflow.json (a resumed sweep), else a new one named as the
        folder: its swept keys as tags, what its runs share (`base`) as params."""
        self.client = client_for(self.uri)
        self.run = existing_run(self.client, read_record(folder).get("run_id"))
        if self.run is not None:
            self.client.update(self.run.run_id, "RUNNING")
        else:
            tags = {"minitfm.sweep": str(folder.resolve()),
                    **{f"swept.{key}": ",".join(values) for key, values in swept}}
            self.run = self.client.create_run(experiment_id(self.client, self.experiment),
                                              folder.name, tags)
            self.client.log_batch(self.run.run_id, params={key: param_text(value)
                                                           for key, value in base.items()})
        self.run_id = self.run.run_id
        write_record(folder, {"run_id": self.run_id})

    def close(self, folder: Path, status: str) -> None:
        files = {path.name: path.read_bytes() for path in sorted(folder.iterdir())
                 if path.is_file() and not path.is_symlink() and path.suffix != ".log"
                 and not path.name.startswith(".") and path.name != RECORD}
        if self.client.serves_files(self.run):
            self.client.log_files(self.run, files)
        else:
            self.unserved = unserved(self.uri, self.run, "the sweep's files", folder)
        self.client.update(self.run_id, status)


def within(seconds: float, call: Callable[[], None]) -> str | None:
    """Run `call` on a thread of its own for at most `seconds` (a tracker that hangs never holds
    the sweep): None when it succeeded, else why not."""
    outcome: list[str | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except Exception as err:  # whatever the tracker did, said in a line
            outcome.append(brief(err))

    thread = threading.Thread(target=run, name="minitfm-mlflow", daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome[0] if outcome else f"no answer within {seconds:g} s"


def python_warning(text: str) -> None:
    """Where no console says a warning (the Python API's `progress=False`): a UserWarning."""
    warnings.warn(text, stacklevel=2)


def client_for(uri: str):
    """The client of the tracker at `uri`: `RestClient` for a server (no mlflow imported),
    else `LibraryClient`, MLflow's own (see the module docstring); the same calls."""
    return RestClient(uri) if speaks_rest(uri) else LibraryClient(uri)


def unserved(uri: str, run: Found, what: str, folder: Path) -> str:
    """The warning for a server whose runs keep their files where only MLflow's client writes
    (a server started with --no-serve-artifacts): `what` stays in `folder` only."""
    return (f"MLflow at {uri} does not take files (the run's go to {run.artifact_uri}, where "
            f"only MLflow's client writes): {what} stay in {folder} only; start the server "
            f"serving artifacts (mlflow server does unless --no-serve-artifacts)")


def experiment_id(client, name: str) -> str:
    """The id of the active experiment `name`, made if need be (another process may make it
    meanwhile: then it is found)."""
    for _ in range(2):
        found = client.experiment(name)
        if found is not None:
            found_id, stage = found
            if stage != "active":
                raise MinitfmError(f"the MLflow experiment {quote(name)} is deleted: restore "
                                   f"it (mlflow experiments restore --experiment-id "
                                   f"{found_id}) or name another with "
                                   f"MLFLOW_EXPERIMENT_NAME")
            return found_id
        made = client.create_experiment(name)
        if made is not None:
            return made
    raise MinitfmError(f"the MLflow experiment {quote(name)} could be neither made nor found")


def existing_run(client, run_id: Any) -> Found | None:
    """The active MLflow run `run_id` (from a folder's mlflow.json), None when the tracker has
    none (another tracker, a deleted run, no id)."""
    if not isinstance(run_id, str) or not run_id:
        return None
    run = client.run(run_id)
    return run if run is not None and run.active else None


class LibraryClient:
    """MLflow's own client (`MlflowClient`), with `RestClient`'s calls, for a tracker that
    client alone reaches: a local store (sqlite:, file:), databricks, an auth plugin. Made on
    the tracker's thread: the import of mlflow is here (a second or so of CPU)."""

    def __init__(self, uri: str):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)

    def experiment(self, name: str) -> tuple[str, str] | None:
        found = self.client.get_experiment_by_name(name)
        return None if found is None else (found.experiment_id, found.lifecycle_stage)

    def create_experiment(self, name: str) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            return self.client.create_experiment(name)
        except MlflowException as err:
            if err.error_code == "RESOURCE_ALREADY_EXISTS":
                return None
            raise

    def run(self, run_id: str) -> Found | None:
        from mlflow.exceptions import MlflowException

        try:
            return self.found(self.client.get_run(run_id))
        except MlflowException as err:
            if err.error_code in GONE:
                return None
            raise

    def create_run(self, experiment_id: str, name: str, tags: dict[str, str]) -> Found:
        return self.found(self.client.create_run(experiment_id, run_name=name, tags=tags))

    def update(self, run_id: str, status: str) -> None:
        """The run's status, and the time now if it ended. `set_terminated` would also print
        the run's address on stdout, from this thread, into the progress display: the store's
        own call sets it without that."""
        from mlflow.entities import RunStatus

        self.client._tracking_client.store.update_run_info(
            run_id, run_status=RunStatus.from_string(status), run_name=None,
            end_time=None if status == "RUNNING" else int(time.time() * 1000))

    def log_batch(self, run_id: str, metrics: list[tuple[str, float, int, int]] = (),
                  params: dict[str, str] | None = None,
                  tags: dict[str, str] | None = None) -> None:
        from mlflow.entities import Metric, Param, RunTag

        self.client.log_batch(run_id, metrics=[Metric(*metric) for metric in metrics],
                              params=[Param(k, v) for k, v in (params or {}).items()],
                              tags=[RunTag(k, v) for k, v in (tags or {}).items()])

    def serves_files(self, run: Found) -> bool:
        return True  # wherever the run's artifact URI is, MLflow's client writes there

    def log_files(self, run: Found, files: dict[str, bytes], folder: str = "") -> None:
        with tempfile.TemporaryDirectory(prefix="minitfm-mlflow-") as where:
            for name, data in files.items():
                (Path(where) / name).write_bytes(data)
            self.client.log_artifacts(run.run_id, where, folder or None)

    @staticmethod
    def found(run) -> Found:
        return Found(run.info.run_id, run.info.experiment_id, run.info.artifact_uri,
                     dict(run.data.params), run.info.lifecycle_stage == "active")


def read_record(folder: Path) -> dict[str, Any]:
    """A folder's mlflow.json, or {} (none, or not one minitfm wrote)."""
    try:
        record = json.loads(read_small(folder / RECORD, RECORD_BYTES) or "{}")
    except (MinitfmError, ValueError):
        return {}
    lines = record.get("lines", 0) if isinstance(record, dict) else None
    if not isinstance(lines, int) or isinstance(lines, bool) or lines < 0:
        return {}
    return record


def write_record(folder: Path, record: dict[str, Any]) -> None:
    write_atomic(folder / RECORD, (to_json(record) + "\n").encode("utf-8"))
