"""TensorBoard logging, read back with TensorBoard's own EventAccumulator and a real server."""

import json
import socket
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from minitfm.app.api import train_run as train  # with TensorBoard and the attention recorder
from minitfm.config import Config, load_config
from minitfm.lab.watch.tb import CARD_WIDTH
from tests.helpers import QUICK, TINY

KINDS = ("encoder", "decoder", "cross")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# One encoder and two decoder layers, so "every layer" means more than layer 0.
LAYERS = {"encoder": 1, "decoder": 2, "cross": 2}
EVALS = [25, 50]
CROSS = "3_attention/cross/layer0/head0"  # one of the pictures
# The groups TensorBoard shows, in its own order (by name): learning curves first.
GROUPS = ["1_loss", "2_accuracy", "3_attention", "4_alignment", "5_train", "6_entropy",
          "7_gauges"]
# Tags that say where a run went and how fast, not what it learned: not in HPARAMS.
NOT_HPARAMS = ("name", "device", "threads", "log.dir", "log.log_every", "log.tensorboard",
               "log.attention_every", "log.attention_record", "log.gauge_every")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A quick copy run evaluated every 25 steps, with the default attention logging, read once."""
    run_dir = tmp_path_factory.mktemp("tb") / "copy"
    default_attention = [item for item in QUICK if not item.startswith("log.attention_every")]
    cfg = load_config(None, [*default_attention, "model.n_decoder_layers=2",
                             "train.eval_every=25", "train.target_exact_match=null"])
    summary = train(cfg, run_dir=run_dir)
    events = EventAccumulator(str(run_dir),
                              size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    return run_dir, summary, events


def steps(events, tag):
    return [event.step for event in events.Scalars(tag)]


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which follows the 8-byte signature."""
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_tag_groups_put_loss_and_exact_match_first(run):
    _, _, events = run
    tags = events.Tags()
    groups = sorted({tag.split("/")[0] for tag in tags["scalars"] + tags["images"]})
    assert groups == GROUPS  # no `hparam/` copies of the final metrics
    assert {"1_loss/train", "1_loss/eval", "2_accuracy/exact_match",
            "2_accuracy/token_accuracy"} <= set(tags["scalars"])


def test_train_and_eval_scalars_have_their_steps(run):
    _, _, events = run
    for tag in ("1_loss/train", "5_train/lr", "5_train/grad_norm", "5_train/tokens_per_s"):
        assert steps(events, tag) == list(range(10, 51, 10)), tag
    for tag in ("1_loss/eval", "2_accuracy/token_accuracy", "2_accuracy/exact_match"):
        assert steps(events, tag) == EVALS, tag


def test_alignment_scalars_per_head_at_every_evaluation(run):
    _, _, events = run
    for layer in range(LAYERS["cross"]):
        for head in range(2):
            values = events.Scalars(f"4_alignment/layer{layer}/head{head}")
            assert [v.step for v in values] == EVALS
            assert all(0.0 <= v.value <= 1.0 for v in values)
    best = events.Scalars("4_alignment/best")
    assert [v.step for v in best] == EVALS and best[-1].value > 0.3


def test_entropy_scalars_per_head_at_every_evaluation_as_recorded(run):
    run_dir, _, events = run
    recorded = [json.loads(line) for line in (run_dir / "attention.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recorded] == EVALS
    for layer in range(LAYERS["cross"]):
        for head in range(2):
            values = events.Scalars(f"6_entropy/layer{layer}/head{head}")
            assert [v.step for v in values] == EVALS
            assert [v.value for v in values] == pytest.approx(
                [r["entropy"][layer][head] for r in recorded], abs=1e-4)


def test_attention_images_of_every_head_at_every_evaluation_by_default(run):
    _, _, events = run
    expected = {f"3_attention/{kind}/layer{layer}/head{head}"
                for kind in KINDS for layer in range(LAYERS[kind]) for head in range(2)}
    assert set(events.Tags()["images"]) == expected
    for tag in expected:
        images = events.Images(tag)
        assert [image.step for image in images] == EVALS, tag  # the end is not doubled
        shapes = {png_size(image.encoded_image_string) for image in images}
        assert shapes == {(images[0].width, images[0].height)}, tag  # one size for all frames
        # one map (16-pixel cells, 6 or 7 tokens) and a colour bar, within a card's width
        assert 150 <= images[0].width <= CARD_WIDTH, (tag, images[0].width)


def test_attention_images_of_the_default_run_fit_tensorboards_cards(tmp_path):
    """The default run's probe has 16 tokens and 4 heads: a grid of a kind's 8 maps was 1,150
    pixels wide, shrunk to a third in the IMAGES tab's 350-pixel cards (letters 4 pixels high).
    One map per image: shown at its own size, every token labelled."""
    run_dir = tmp_path / "default"
    train(load_config(None, ["train.steps=2", "train.warmup_steps=1", "train.eval_every=2",
                             "train.eval_samples=20"]), run_dir=run_dir)
    events = EventAccumulator(str(run_dir), size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()["images"]
    model = Config().model  # encoder self-attention, then decoder self- and cross-attention
    layers = model.n_encoder_layers + 2 * model.n_decoder_layers
    assert len(tags) == layers * model.n_heads == 20, tags  # 1 + 2 + 2 layers; 4 heads
    widths = {events.Images(tag)[-1].width for tag in tags}
    assert 300 <= min(widths) and max(widths) <= CARD_WIDTH, widths


def test_attention_images_change_as_the_model_learns(run):
    import io

    import matplotlib.image

    _, _, events = run
    first, last = (matplotlib.image.imread(io.BytesIO(image.encoded_image_string), format="png")
                   for image in (events.Images(CROSS)[i] for i in (0, -1)))
    assert first.ndim == 3 and first.shape[2] in (3, 4)
    assert first[..., :3].std(axis=2).max() > 0.2  # a colour map, not grey
    assert first.shape == last.shape and abs(first - last).max() > 0.2  # new maps each frame


def test_config_and_samples_text(run):
    _, _, events = run
    assert {"config/text_summary", "samples/text_summary"} <= set(events.Tags()["tensors"])
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "n_symbols: 5" in config and config.startswith("```")
    samples = events.Tensors("samples/text_summary")
    assert [s.step for s in samples] == EVALS
    table = samples[-1].tensor_proto.string_val[0].decode()
    assert table.startswith("| input | target | prediction | ok |")
    assert len(table.splitlines()) == 2 + 5


def test_hparams_hold_the_keys_that_change_what_a_run_learns(run):
    run_dir, summary, events = run
    # No stray run: every event file lies in the run directory itself.
    assert {p.parent for p in run_dir.rglob("events.out.tfevents.*")} == {run_dir}
    content = events.PluginTagToContent("hparams")
    # No experiment summary: TensorBoard builds it from every run (see minitfm.lab.watch.tb.finish).
    assert set(content) == {"_hparams_/session_start_info", "_hparams_/session_end_info"}
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["model.n_decoder_layers"].number_value == 2
    assert start.hparams["task.name"].string_value == "copy"
    assert start.hparams["train.target_exact_match"].string_value == "null"
    keys = set(start.hparams)
    assert "seed" in keys and {k.split(".")[0] for k in keys} == {"seed", "task", "model",
                                                                  "train"}
    assert not keys & set(NOT_HPARAMS)
    assert not any(tag.startswith("hparam") for tag in events.Tags()["scalars"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, **query) -> bytes:
    url = f"http://127.0.0.1:{port}{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


def wait_for_run(port: int, name: str, server, log, timeout: float = 60.0) -> None:
    """Poll /data/runs until the run is listed (the server loads event files in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, f"tensorboard exited: {log.read_text()[-2000:]}"
        try:
            if name in json.loads(get(port, "/data/runs")):
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"tensorboard did not list run {name!r} within {timeout:.0f} s: "
                f"{log.read_text()[-2000:]}")


@pytest.mark.slow
def test_tensorboard_server_serves_images_scalars_and_hparams(run, tmp_path):
    run_dir, _, events = run
    try:
        port = free_port()
    except OSError as err:
        pytest.skip(f"cannot bind a loopback port: {err}")
    log = tmp_path / "tensorboard.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(run_dir.parent),
             "--host", "127.0.0.1", "--port", str(port), "--load_fast", "false",
             "--samples_per_plugin", "images=100"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_run(port, run_dir.name, server, log)
        tags = json.loads(get(port, "/data/plugin/images/tags"))[run_dir.name]
        assert CROSS in tags, tags
        images = json.loads(get(port, "/data/plugin/images/images", run=run_dir.name,
                                tag=CROSS, sample=0))
        assert [image["step"] for image in images] == EVALS
        blob = get(port, "/data/plugin/images/individualImage?" + images[-1]["query"])
        stored = events.Images(CROSS)[-1]
        assert png_size(blob) == (stored.width, stored.height)  # the whole picture, not a thumbnail
        scalars = json.loads(get(port, "/data/plugin/scalars/scalars", run=run_dir.name,
                                 tag="1_loss/train"))
        assert [step for _, step, _ in scalars] == list(range(10, 51, 10))
        # What the HPARAMS tab asks for: its columns, and its metrics (the first 5 shown).
        experiment = json.loads(get(port, "/data/plugin/hparams/experiment",
                                    request='{"experimentName": "", "hparamsLimit": 1000}'))
        names = {info["name"] for info in experiment["hparamInfos"]}
        assert "model.d_model" in names and "task.name" in names and "seed" in names
        assert not names & set(NOT_HPARAMS), names
        metrics = [info["name"]["tag"] for info in experiment["metricInfos"]]
        assert metrics[:4] == ["1_loss/eval", "1_loss/train", "2_accuracy/exact_match",
                               "2_accuracy/token_accuracy"], metrics
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_attention_every_n_steps_and_at_the_end(tmp_path):
    cfg = load_config(None, [*TINY, "train.steps=60", "train.eval_every=25",
                             "train.target_exact_match=null", "log.attention_every=40"])
    train(cfg, run_dir=tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run"), size_guidance={"images": 0})
    events.Reload()
    assert [image.step for image in events.Images(CROSS)] == [40, 60]
    assert [event.step for event in events.Scalars("2_accuracy/exact_match")] == [25, 50, 60]


def test_png_bytes_decode_to_the_same_pixels():
    import io

    import numpy as np
    from PIL import Image

    from minitfm.lab.watch.tb import png_bytes

    pixels = np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8)
    decoded = Image.open(io.BytesIO(png_bytes(pixels)))
    assert decoded.mode == "RGB" and (np.asarray(decoded) == pixels).all()


@pytest.mark.parametrize("length", [0, 1, 4, 15, 16, 17, 2047, 2048, 2049, 4096, 4097, 54321])
def test_checksums_are_tensorboards_own(length):
    """crc32c.py against TensorBoard's byte-at-a-time CRC-32C, around each of its cuts: the short
    records, the blocks, the pairs of lanes."""
    import random

    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow

    from minitfm.lab.watch.crc32c import crc32c, masked_crc32c

    data = random.Random(length).randbytes(length)
    assert masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)
    assert masked_crc32c(bytes(length)) == pywrap_tensorflow.masked_crc32c(bytes(length))
    assert crc32c(b"123456789") == 0xE3069283  # CRC-32C's check value (RFC 3720)


def test_the_run_writes_its_records_with_the_fast_checksum_and_tensorboard_reads_them(run):
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
    from tensorboard.summary.writer import record_writer

    from minitfm.lab.watch.crc32c import masked_crc32c

    assert record_writer.masked_crc32c is masked_crc32c  # set when the logger started
    run_dir, _, _ = run
    (path,) = run_dir.glob("events.out.tfevents.*")
    reader = pywrap_tensorflow.PyRecordReader_New(str(path))  # checks each record's two CRCs
    records = 0
    while True:
        try:
            reader.GetNext()
        except pywrap_tensorflow.errors.OutOfRangeError:
            break
        records += 1
    assert records > 50  # scalars, text, and the pictures (long records, in lanes)


def test_a_resumed_runs_event_file_is_read_after_those_of_the_process_before_it(tmp_path,
                                                                               monkeypatch):
    """TensorBoard reads event files in name order, which starts with the second each was made
    in and then the pid as text: a resume within the killed process's second waits for the next
    one, so its file comes last and its purge mark hides the killed process's later steps."""
    import time

    from minitfm.lab.watch import tb

    now = int(time.time())
    (tmp_path / f"events.out.tfevents.{now}.host.99999.0.abc").write_bytes(b"")
    (tmp_path / "events.out.tfevents.notanumber").write_bytes(b"")  # not TensorBoard's: ignored
    tb.after_earlier_files(tmp_path)
    assert time.time() >= now + 1  # the next second has come
    slept = []
    monkeypatch.setattr(tb.time, "sleep", slept.append)
    (tmp_path / f"events.out.tfevents.{now}.host.99999.0.abc").unlink()
    (tmp_path / f"events.out.tfevents.{now - 5}.host.1.0.abc").write_bytes(b"")
    tb.after_earlier_files(tmp_path)  # only files of earlier seconds: no wait
    assert slept == [0.0]
