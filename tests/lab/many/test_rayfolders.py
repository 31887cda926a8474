"""What a Ray task sends back, checked on the driver before anything is replaced (#55): hand-made
archives given to `rayfolders.receive`, and results given to `RayScheduler.finish` (no cluster
needed: a stand-in for `ray.get`). The sweeps on a real cluster are in test_ray.py."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from minitfm.config import load_config
from minitfm.errors import MinitfmError, shown_path
from minitfm.lab.many import ray_launcher, rayfolders
from minitfm.lab.many.grid import RunSpec
from minitfm.lab.many.rayfolders import pack, receive
from minitfm.lab.many.scheduler import Job

REPORT = {"exact_match": 0.5, "per_length": {"3": {"exact_match": 0.5, "count": 4}},
          "checkpoint": "/on/the/worker/last.pt"}
NOT_A_RUN = "the run r1 sent back by Ray is not a run folder: "


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info, io.BytesIO(data) if kind == tarfile.REGTYPE else None


def archive(*members) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        for info, body in members:
            tar.addfile(info, body)
    return data.getvalue()


def good_run(name: str = "r1") -> list:
    return [member(name, kind=tarfile.DIRTYPE),
            member(f"{name}/summary.json", b'{"status": "finished", "step": 12}'),
            member(f"{name}/eval-1-6.json", json.dumps(REPORT).encode())]


def files_under(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (links and folders included, nothing followed): its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() and not p.is_symlink()
            else None for p in sorted(root.rglob("*"))}


@pytest.fixture
def sweep(tmp_path):
    """A sweep folder whose run r1 holds what a task sent back before (its summary)."""
    folder = tmp_path / "sw"
    (folder / "r1").mkdir(parents=True)
    (folder / "r1" / "summary.json").write_text('{"status": "finished", "step": 4}')
    return folder


def spec(folder: Path, run_id: str = "r1") -> RunSpec:
    return RunSpec(run_id, {}, [], load_config(None, ["task.max_len=6"]), folder / run_id)


def test_a_good_archive_replaces_the_run_and_names_its_checkpoint_here(sweep):
    receive(spec(sweep), archive(*good_run()), b"trained on the worker\n")
    assert json.loads((sweep / "r1" / "summary.json").read_text())["step"] == 12
    report = json.loads((sweep / "r1" / "eval-1-6.json").read_text())
    assert report["checkpoint"] == str(sweep / "r1" / "checkpoints" / "last.pt")
    assert (sweep / "r1.log").read_bytes() == b"trained on the worker\n"
    assert sorted(p.name for p in sweep.iterdir()) == ["r1", "r1.log"]  # nothing left beside


NESTED = b"[" * 100_000 + b"]" * 100_000
BAD = {
    "no folder for the run": ([], "its archive holds no folder 'r1'"),
    "another folder": ([member("other", kind=tarfile.DIRTYPE), member("other/summary.json",
                                                                        b"{}")],
                       "its archive holds 'other', outside the folder 'r1'"),
    "the run a file": ([member("r1", b"not a folder")], "'r1' in its archive is"),
    "the run a link": ([member("r1", kind=tarfile.SYMTYPE, link="x")], "a symbolic link"),
    "eval not UTF-8": ([*good_run()[:2], member("r1/eval-1-6.json", b"\xff\xfe{}")],
                       "'r1/eval-1-6.json' is no evaluation"),
    "eval a list": ([*good_run()[:2], member("r1/eval-1-6.json", b"[1, 2]")],
                    "'r1/eval-1-6.json' is no evaluation"),
    "eval a folder": ([*good_run()[:2], member("r1/eval-1-6.json", kind=tarfile.DIRTYPE)],
                      "'r1/eval-1-6.json' is no evaluation"),
    "eval nested deeply": ([*good_run()[:2], member("r1/eval-1-6.json", NESTED)],
                           "'r1/eval-1-6.json' is no evaluation"),
    "eval a link to the summary": ([*good_run()[:2], member(
        "r1/eval-1-6.json", kind=tarfile.SYMTYPE, link="summary.json")], "a symbolic link"),
    "not a tar archive": (None, "its archive cannot be unpacked"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_what_is_not_a_run_folder_fails_the_run_and_the_old_folder_stays(sweep, case):
    members, says = BAD[case]
    data = archive(*members) if members is not None else b"no tar here" * 100
    before = files_under(sweep / "r1")
    with pytest.raises(MinitfmError) as caught:
        receive(spec(sweep), data, b"log of the task\n")
    message = str(caught.value)
    assert message.startswith(NOT_A_RUN) and says in message and "\n" not in message, message
    assert files_under(sweep / "r1") == before  # untouched, summary.json included
    assert sorted(p.name for p in sweep.iterdir()) == ["r1", "r1.log"]
    assert (sweep / "r1.log").read_bytes() == b"log of the task\n"  # kept for the reader


def test_an_archive_that_reaches_outside_the_sweep_folder_writes_nothing_there(tmp_path, sweep):
    """Upward paths, an absolute path, a link out and a file through it: each archive refused
    in one line; nothing written outside the sweep folder, the old run as it was (O4)."""
    target = tmp_path / "target"
    target.mkdir()
    hostile = {
        "upward": [*good_run(), member("../../outside", b"x")],
        "upward in the run": [*good_run(), member("r1/../../../outside2", b"x")],
        "absolute": [*good_run(), member(str(tmp_path / "absolute"), b"x")],
        "a link out": [*good_run(), member("r1/out", kind=tarfile.SYMTYPE, link=str(target)),
                       member("r1/out/written", b"x")],
        "a link up": [*good_run(), member("r1/up", kind=tarfile.SYMTYPE, link="../../.."),
                      member("r1/up/written2", b"x")],
    }
    before = files_under(sweep / "r1")
    for case, members in hostile.items():
        with pytest.raises(MinitfmError) as caught:
            receive(spec(sweep), archive(*members), b"")
        assert str(caught.value).startswith(NOT_A_RUN), (case, caught.value)
        assert "\n" not in str(caught.value), case
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sw", "target"], case
        assert list(target.iterdir()) == [], case
        assert files_under(sweep / "r1") == before, case
        assert sorted(p.name for p in sweep.iterdir()) == ["r1", "r1.log"], case


def test_a_run_directory_too_large_to_send_back_says_so_and_names_the_way_out(tmp_path,
                                                                               monkeypatch):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "metrics.jsonl").write_bytes(b"x" * 64)
    monkeypatch.setattr(rayfolders, "MAX_RETURN", 10)
    with pytest.raises(MinitfmError, match=r"holds 64 bytes, more than the 10 .* shared folder"):
        pack(run)


class FakeRay:
    """`ray.get` of refs that are the results (or the errors) themselves."""

    @staticmethod
    def get(ref):
        if isinstance(ref, Exception):
            raise ref
        return ref


def scheduler_of(sweep: Path, ids: list[str]) -> tuple[ray_launcher.RayScheduler, list[Job], list]:
    said = []
    jobs = [Job(spec(sweep, run_id), [object()]) for run_id in ids]
    return ray_launcher.RayScheduler(jobs, {}, FakeRay(), said.append), jobs, said


def test_a_run_that_failed_on_ray_is_reported_failed_and_the_sweep_goes_on(sweep):
    """An evaluation that exited 2, a task that raised, a run sent back broken, a result of
    another minitfm: each `failed:` in one line, as the local sweep says it; the good run is
    counted done."""
    ids = ["r1", "r2", "r3", "r4", "r5"]
    for run_id in ids[1:]:
        (sweep / run_id).mkdir()
    (sweep / "r2.log").write_text("error: --samples (0) is below 1\n")
    scheduler, jobs, said = scheduler_of(sweep, ids)
    error = TypeError("ray::run_work() (pid=1)\n  File \"x.py\", line 3\nTypeError: bad work")
    results = [
        {"node": "a", "mode": "copied", "exits": {"r1": 0},
         "runs": {"r1": archive(member("r1", b"a file"))}, "logs": {"r1": b""}},
        {"node": "a", "mode": "shared", "exits": {"r2": 2}},
        error,
        {"node": "b", "mode": "copied", "exits": {"r4": 0},
         "runs": {"r4": archive(*good_run("r4"))}, "logs": {"r4": b""}},
        {"node": "b", "mode": "shared"},  # run_work before it said each run's exit code
    ]
    for job, result in zip(jobs, results):
        scheduler.finish(job, result, stopping=False)
    assert said[0].startswith(f"failed: r1; {NOT_A_RUN}'r1' in its archive is"), said
    assert said[1] == f"failed: r2 (exit 2); see {shown_path(sweep / 'r2.log')}: error: " \
                      f"--samples (0) is " \
                      f"below 1", said
    assert said[2].startswith("failed: r3; its Ray task failed: TypeError: bad work"), said
    assert "TypeError: bad work" in (sweep / "r3.log").read_text()
    assert said[3].startswith("[1/5] r4: finished at step 12"), said
    assert said[4] == "failed: r5; its Ray task sent back a result this minitfm does not " \
                      "read: install the same minitfm on every node", said
    assert [s.id for s in scheduler.failed] == ["r1", "r2", "r3", "r5"]
    assert (sweep / "r1" / "summary.json").read_text() == '{"status": "finished", "step": 4}'
