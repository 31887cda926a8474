"""Sweeps on Ray (#49), on a real cluster: two nodes on this machine (`ray start --head` and a
second `ray start --address=...`, one CPU each), started and stopped by these tests alone (their
processes are found by session and killed by PID; nothing else of Ray's is touched)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import TINY, assert_clean_error, given_once, missing, run_cli

pytestmark = pytest.mark.slow  # a cluster of processes, and sweeps of them
RAY = Path(sys.executable).parent / "ray"
RUNS = [*TINY, "train.steps=12", "train.eval_every=0", "train.warmup_steps=2",
        "train.checkpoint_every=4", "log.tensorboard=false"]
UP_S = 60  # how long a node may take to join


def ray_or_skip() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        missing("Ray is not installed (pip install -e '.[ray]')")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session(pid: int) -> list[int]:
    """The processes of the session `pid` leads (a node's: its raylet, workers, ...)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    return [int(p) for p, s in (line.split() for line in out.splitlines()) if int(s) == pid]


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@dataclass
class Node:
    """A `ray start --block` process, leader of its node's session."""

    proc: subprocess.Popen

    def raylet(self) -> int:
        return next(pid for pid in session(self.proc.pid) if "raylet" in command_of(pid))

    def stop(self) -> None:
        """SIGTERM to `ray start --block`, which stops its node; then SIGKILL to what is left
        of its session."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        for pid in session(self.proc.pid):
            os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def start_node(tmp: Path, *args: str, **env: str) -> Node:
    """A node started in `tmp/nodes` (its processes' working folder: nothing may be written
    there), with `env` added to this process's environment."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",  # RAY_AUTH_*: see `cluster`
           # a killed node is found dead within a few seconds (Ray's default: ~30 s)
           "RAY_health_check_period_ms": "500", "RAY_health_check_timeout_ms": "500",
           "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "0",
           **env}
    (tmp / "nodes").mkdir(exist_ok=True)
    log = open(tmp / f"node-{len(list(tmp.glob('node-*')))}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([str(RAY), "start", "--block", "--num-cpus=1",
                             "--node-ip-address=127.0.0.1", "--disable-usage-stats", *args],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp / "nodes",
                            start_new_session=True)
    return Node(proc)


def alive_nodes(address: str) -> int:
    code = (f"import ray; ray.init(address={address!r}, logging_level='ERROR', "
            f"log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=20)
    except subprocess.TimeoutExpired:
        return 0
    return int(out.stdout.split()[-1]) if out.returncode == 0 and out.stdout.split() else 0


@dataclass
class Cluster:
    address: str
    head: Node
    worker: Node


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """Two nodes, one CPU each, on this machine; every process of both gone afterwards. With
    Ray's token authentication, a token of its own given to its nodes and drivers alike by
    RAY_AUTH_TOKEN (~/.ray is never read nor written): no one else's sweep can join it (one
    that found it by `--ray-address auto` once wrote into the nodes' working folder)."""
    ray_or_skip()
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    port = free_port()
    address = f"127.0.0.1:{port}"
    # Ray's sockets live in its temp folder, and a socket's path may have 107 bytes at most
    short = Path(tempfile.mkdtemp(prefix="mtr-", dir="/tmp"))
    head = start_node(tmp_path, "--head", f"--port={port}", "--include-dashboard=false",
                      f"--temp-dir={short}")
    nodes = [head]
    try:
        worker = start_node(tmp_path, f"--address={address}")
        nodes.append(worker)
        deadline = time.monotonic() + UP_S
        while alive_nodes(address) < 2:
            assert head.proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "node-0.log").read_text()[-2000:]
            time.sleep(0.5)
        yield Cluster(address, head, worker)
    finally:
        leaders = [node.proc.pid for node in nodes]
        for node in reversed(nodes):
            node.stop()
        left = [pid for leader in leaders for pid in session(leader)]
        shutil.rmtree(short, ignore_errors=True)
        assert left == [], [command_of(pid) for pid in left]


def sweep_args(out: Path, seeds: str, *more: str) -> list[str]:
    return given_once(["sweep", *RUNS, "--seeds", seeds, "--threads", "1", "--eval-samples",
                       "20", "--out", out, *more])


def rows(folder: Path) -> dict[str, dict]:
    keep = ("status", "steps", "exact_match", "per_length", "reached")
    return {row["run"]: {k: row[k] for k in keep}
            for row in map(json.loads, (folder / "results.jsonl").open())}


def evaluations(folder: Path) -> dict[str, list]:
    """Each run's evaluation lines (step, loss, exact match) from its metrics.jsonl."""
    found = {}
    for run in sorted(p for p in folder.iterdir() if (p / "metrics.jsonl").is_file()):
        lines = map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
        found[run.name] = [(r["step"], r["loss"], r["exact_match"]) for r in lines
                           if r["split"] == "eval"]
    return found


def test_a_sweep_on_two_nodes_finishes_every_run_when_one_node_dies(cluster, tmp_path):
    """16 tiny runs on the two-node cluster; once 4 have ended, the second node's raylet is
    killed (SIGKILL, by its PID): the sweep still ends with all 16, each counted once, the
    tasks having run on both nodes, and its table and evaluations are the local sweep's. Its
    --out is relative: the runs go where the driver runs, never into the working folder of the
    nodes (each path a task gets is absolute)."""
    out = tmp_path / "on-ray"
    cmd = [sys.executable, "-m", "minitfm", *sweep_args(Path("on-ray"), "0..15", "--on", "ray",
                                                        "--ray-address", cluster.address)]
    with open(tmp_path / "sweep.out", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                cwd=tmp_path)
        try:
            deadline = time.monotonic() + 180
            while sum(1 for p in out.glob("*/summary.json")) < 4:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "sweep.out").read_text()
                time.sleep(0.1)
            os.kill(cluster.worker.raylet(), signal.SIGKILL)
            proc.wait(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    said = (tmp_path / "sweep.out").read_text()
    assert proc.returncode == 0, said
    assert "on Ray: 2 nodes ran the jobs; run directories written in place" in said
    assert said.count("[16/16]") == 1 and "failed: " not in said  # Ray says it retried
    assert list((tmp_path / "nodes").iterdir()) == []
    local = run_cli(*sweep_args(tmp_path / "local", "0..15"))
    assert local.exit_code == 0, local.stdout + local.stderr
    assert rows(out) == rows(tmp_path / "local")
    assert evaluations(out) == evaluations(tmp_path / "local")


def test_workers_that_do_not_see_the_sweep_folder_send_each_run_directory_back(cluster,
                                                                                tmp_path):
    """The sweep folder on a tmpfs of the driver's own mount namespace, which the nodes do not
    see: each task trains in a folder of its own and sends the run back; every run directory
    arrives whole, its training losses those of the local sweep. A stale token in the nodes'
    view of the folder (another sweep's) does not make them write there."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        missing("a private mount namespace needs unshare and root")
    private = tmp_path / "private"
    (private / "sw").mkdir(parents=True)
    # where the nodes look, a token another sweep left (killed by SIGKILL): not this sweep's
    (private / "sw" / ".minitfm-ray-token").write_text("0" * 32)
    sweep = " ".join(map(repr, [sys.executable, "-m", "minitfm",
                                *sweep_args(private / "sw", "0..3", "--on", "ray",
                                            "--ray-address", cluster.address)]))
    script = (f"mount -t tmpfs tmpfs {private} && {sweep} && "
              f"cp -a {private / 'sw'} {tmp_path / 'arrived'}")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sent back through Ray's object store" in done.stdout, done.stdout
    # the sweep only ever was in the driver's namespace: the nodes wrote nothing beside the token
    assert [p.name for p in (private / "sw").iterdir()] == [".minitfm-ray-token"]
    local = run_cli(*sweep_args(tmp_path / "local", "0..3"))
    arrived = tmp_path / "arrived"
    for run in ("seed=0", "seed=1", "seed=2", "seed=3"):
        names = {p.relative_to(arrived / run).parts[0] for p in (arrived / run).rglob("*")}
        assert names >= {"config.yaml", "metrics.jsonl", "checkpoints", "summary.json",
                         "eval-1-6.json"}, names
        assert (arrived / run / "metrics.jsonl").read_text() != ""
        report = json.loads((arrived / run / "eval-1-6.json").read_text())
        assert report["checkpoint"] == str(private / "sw" / run / "checkpoints" / "last.pt")
        ours = [json.loads(line)["loss"] for line in (arrived / run / "metrics.jsonl").open()]
        theirs = [json.loads(line)["loss"]
                  for line in (tmp_path / "local" / run / "metrics.jsonl").open()]
        assert ours == theirs
    assert local.exit_code == 0 and rows(arrived) == rows(tmp_path / "local")


def test_an_unreachable_cluster_or_no_ray_is_one_line(tmp_path, monkeypatch):
    ray_or_skip()
    port = free_port()  # nothing listens there
    result = run_cli(*sweep_args(tmp_path / "sw", "0", "--on", "ray", "--ray-address",
                                 f"127.0.0.1:{port}"))
    assert_clean_error(result, 2, f"cannot reach the Ray cluster at '127.0.0.1:{port}'")
    result = run_cli(*sweep_args(tmp_path / "sw", "0", "--on", "ray", "--ray-address",
                                 "localhost"))  # no port
    assert_clean_error(result, 2, "--ray-address ('localhost') is not HOST:PORT", "6379")
    monkeypatch.setenv("RAY_ADDRESS", "localhost:port")
    result = run_cli(*sweep_args(tmp_path / "sw", "0", "--on", "ray"))
    assert_clean_error(result, 2, "RAY_ADDRESS ('localhost:port') is not HOST:PORT")
    assert not (tmp_path / "sw").exists()
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    result = run_cli(*sweep_args(tmp_path / "sw2", "0", "--on", "ray"))
    assert_clean_error(result, 2, "pip install 'minitfm[ray]'")


def answers(address: str, env: dict[str, str]) -> bool:
    """Whether a Ray cluster at `address` answers a process with `env` (and takes its token)."""
    code = "import sys; from ray._raylet import GcsClient; GcsClient(address=sys.argv[1])"
    try:
        return subprocess.run([sys.executable, "-P", "-c", code, address], capture_output=True,
                              env=env, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def test_a_cluster_that_refuses_the_sweeps_token_is_one_line_before_any_folder(tmp_path,
                                                                              monkeypatch):
    """A head node with Ray's token authentication (its token given by RAY_AUTH_TOKEN, in a
    HOME of its own: ~/.ray is never touched): a sweep without the token, with token mode and
    no token, with another token: one line each, naming what to set, exit 2, no sweep folder.
    With the cluster's token, the same check lets the sweep through."""
    ray_or_skip()
    token, port = "ab" * 32, free_port()
    address = f"127.0.0.1:{port}"
    short = Path(tempfile.mkdtemp(prefix="mtr-", dir="/tmp"))
    (tmp_path / "head-home").mkdir()
    (tmp_path / "home").mkdir()
    head = start_node(tmp_path, "--head", f"--port={port}", "--include-dashboard=false",
                      f"--temp-dir={short}", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
                      HOME=str(tmp_path / "head-home"))
    try:
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        deadline = time.monotonic() + 2 * UP_S
        while not answers(address, env):
            assert head.proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "node-0.log").read_text()[-2000:]
            time.sleep(0.5)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ray/auth_token there
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
        monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
        sweep = sweep_args(tmp_path / "sw", "0", "--on", "ray", "--ray-address", address)
        assert_clean_error(run_cli(*sweep), 2, f"the Ray cluster at '{address}' uses token "
                           f"authentication and refused this sweep", "set RAY_AUTH_MODE=token",
                           "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        assert_clean_error(run_cli(*sweep), 2, "RAY_AUTH_MODE is token, but no Ray token is "
                           f"found here for the cluster at '{address}'", "~/.ray/auth_token")
        monkeypatch.setenv("RAY_AUTH_TOKEN", "cd" * 32)
        assert_clean_error(run_cli(*sweep), 2, "uses token authentication and refused")
        assert not (tmp_path / "sw").exists()
        monkeypatch.setenv("RAY_AUTH_TOKEN", token)
        from minitfm.lab.many.raycluster import check_cluster

        check_cluster(address)  # the cluster's own token: no refusal
    finally:
        head.stop()
        shutil.rmtree(short, ignore_errors=True)
    assert session(head.proc.pid) == []


def test_an_address_where_something_else_listens_is_one_line_and_stops_at_sigterm(tmp_path):
    """A web server at the address, not Ray: after a deadline, one line and exit 2, none of
    Ray's own log lines, no sweep folder; SIGTERM while it asks ends the sweep at once (143),
    and the child that asks with it."""
    ray_or_skip()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + UP_S
        while not listening(port):
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.2)
        cmd = [sys.executable, "-P", "-m", "minitfm",
               *sweep_args(tmp_path / "sw", "0", "--on", "ray", "--ray-address",
                           f"127.0.0.1:{port}")]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"error: nothing at '127.0.0.1:{port}' answers as a Ray "
                                      f"cluster") and done.stderr.count("\n") == 1, done.stderr
        assert not (tmp_path / "sw").exists()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + UP_S
            while not [pid for pid in children(proc.pid) if "raycluster" in command_of(pid)]:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.1)
            asking = children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 143, stderr
        assert stderr.startswith("interrupted: SIGTERM") and stderr.count("\n") == 1, stderr
        assert [pid for pid in asking if command_of(pid)] == []
    finally:
        server.kill()
        server.wait()


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    return [int(p) for p, parent in (line.split() for line in out.splitlines())
            if int(parent) == pid]


def own_ray(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """The environment of a sweep that starts a Ray of its own, and Ray's temp folder there
    (short: Ray's sockets live in it): no RAY_ADDRESS, and a HOME of the test's own, where Ray
    writes its token (~/.ray/auth_token, which would turn token authentication on for every
    later cluster of the machine)."""
    temp = Path(tempfile.mkdtemp(prefix="mtr-", dir="/tmp"))
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    return {**env, "RAY_TMPDIR": str(temp), "HOME": str(tmp_path / "home")}, temp


def processes_of(temp: Path) -> list[str]:
    """The processes whose command line names the folder `temp` (a Ray's, started there)."""
    out = subprocess.run(["ps", "-eo", "pid="], capture_output=True, text=True).stdout
    return [command_of(pid) for pid in map(int, out.split()) if str(temp) in command_of(pid)]


def test_with_no_address_ray_starts_on_this_machine_and_stops_with_the_sweep(tmp_path):
    """`--on ray` with no --ray-address and no RAY_ADDRESS: a Ray of this machine's own, for
    this sweep, even where an earlier `ray start` left the address of a cluster long gone in
    Ray's temp folder (Ray alone would try to join it, and wait); its results are the local
    sweep's, and none of its processes outlive it, nor its token in the sweep folder. Run from
    a folder holding a `minitfm/` package, which no worker imports (Ray puts the driver's
    working folder first on each worker's sys.path unless told otherwise)."""
    ray_or_skip()
    env, temp = own_ray(tmp_path)
    (temp / "ray").mkdir()
    (temp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    here = tmp_path / "here"
    (here / "minitfm").mkdir(parents=True)
    (here / "minitfm" / "__init__.py").write_text(
        f"import os, sys\nopen({str(tmp_path / 'canary')!r} + str(os.getpid()), 'w')"
        f".write(' '.join(sys.argv))\n")
    try:
        done = subprocess.run([sys.executable, "-P", "-m", "minitfm",
                               *sweep_args(tmp_path / "sw", "0..1", "--on", "ray")],
                              capture_output=True, text=True, env=env, cwd=here, timeout=240)
        time.sleep(1)
        left = processes_of(temp)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    canaries = [p.read_text() for p in tmp_path.glob("canary*")]
    assert canaries == [], canaries  # who imported the planted package
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on Ray: a Ray started on this machine" in done.stdout
    assert left == [], left
    assert not (tmp_path / "sw" / ".minitfm-ray-token").exists()
    local = run_cli(*sweep_args(tmp_path / "local", "0..1"))
    assert local.exit_code == 0 and rows(tmp_path / "sw") == rows(tmp_path / "local")


DRIVER = """import sys
from dataclasses import replace
from minitfm.app.cli import main
from minitfm.lab.many import ray_launcher
planned = ray_launcher.ray_jobs
def spoiled(jobs, plan, token):  # seed=0 evaluates --samples 0; seed=1's task raises
    works = planned(jobs, plan, token)
    for key, work in works.items():
        seed = work.specs[0].id
        works[key] = replace(work, samples=0) if seed == "seed=0" else replace(work, folder=0)
    return works
ray_launcher.ray_jobs = spoiled
sys.argv = ["minitfm", *sys.argv[1:]]
main()
"""


def test_a_run_that_fails_on_ray_is_failed_as_it_would_be_locally(tmp_path):
    """A run whose evaluation exits 2 after training well, and one whose task raises in the
    worker: each is `failed:` as the local sweep says it (the exit code and the log's last line;
    Ray's error), and the sweep exits 1."""
    ray_or_skip()
    env, temp = own_ray(tmp_path)
    try:
        done = subprocess.run([sys.executable, "-P", "-c", DRIVER,
                               *sweep_args(tmp_path / "sw", "0..1", "--on", "ray")],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = sorted(line for line in done.stdout.splitlines() if line.startswith("failed: "))
    assert len(failed) == 2, done.stdout
    assert failed[0].startswith("failed: seed=0 (exit 2); see sw/seed=0.log: "), failed
    assert "--samples" in failed[0], failed  # eval's own error, the log's last line
    assert failed[1].startswith("failed: seed=1; its Ray task failed: TypeError: unsupported "
                                "operand type(s) for /: 'int' and 'str'"), failed
    whole = (tmp_path / "sw" / "seed=1.log").read_text()  # Ray's whole error, no colours
    assert "ray::run_work()" in whole and 'File "' in whole and "\x1b" not in whole, whole
    assert done.stderr.strip().splitlines()[-1].startswith("error: 2 of 2 runs failed")


def test_ctrl_c_of_the_driver_cancels_the_tasks_and_each_run_keeps_its_checkpoint(cluster,
                                                                                   tmp_path):
    """SIGINT to `sweep --on ray` once both runs have a last.pt: the tasks are cancelled, each
    training hears SIGINT and saves, the sweep exits 130; the same command would resume both."""
    out = tmp_path / "sw"
    grid = [*sweep_args(out, "0..1", "--on", "ray", "--ray-address", cluster.address),
            "train.steps=100000", "train.target_exact_match=null"]
    proc = subprocess.Popen([sys.executable, "-m", "minitfm", *given_once(grid)],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        checkpoints = [out / f"seed={s}" / "checkpoints" / "last.pt" for s in (0, 1)]
        deadline = time.monotonic() + 120
        while not all(p.is_file() for p in checkpoints):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "stopped 2 run(s), each with its checkpoints/last.pt" in stderr
    for path in checkpoints:
        summary = json.loads((path.parent.parent / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["step"] < 100000
    plan = run_cli(*[a for a in grid if a not in ("--on", "ray", "--ray-address",
                                                  cluster.address)], "--dry-run")
    assert [line.count(" --resume ") for line in plan.stdout.splitlines()] == [1, 1]
