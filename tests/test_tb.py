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

from minitfm.config import load_config
from minitfm.train import train
from tests.helpers import QUICK

KINDS = ("encoder", "decoder", "cross")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# One encoder and two decoder layers, so "every layer" means more than layer 0.
LAYERS = {"encoder": 1, "decoder": 2, "cross": 2}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A quick copy run with attention images at steps 25 and 50, read back once."""
    run_dir = tmp_path_factory.mktemp("tb") / "copy"
    cfg = load_config(None, [*QUICK, "model.n_decoder_layers=2", "train.eval_every=25",
                             "train.target_exact_match=null", "log.attention_every=25"])
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


def test_train_and_eval_scalars_have_their_steps(run):
    _, _, events = run
    for key in ("loss", "lr", "grad_norm", "tokens_per_s"):
        assert steps(events, f"train/{key}") == list(range(10, 51, 10)), key
    for key in ("loss", "token_accuracy", "exact_match"):
        assert steps(events, f"eval/{key}") == [25, 50], key


def test_alignment_scalars_per_head_when_attention_is_logged(run):
    _, _, events = run
    for layer in range(LAYERS["cross"]):
        for head in range(2):
            values = events.Scalars(f"alignment/layer{layer}/head{head}")
            assert [v.step for v in values] == [25, 50]
            assert all(0.0 <= v.value <= 1.0 for v in values)
    best = events.Scalars("alignment/best")
    assert [v.step for v in best] == [25, 50] and best[-1].value > 0.3


def test_attention_images_for_every_kind_and_layer(run):
    _, _, events = run
    expected = {f"attention/{kind}/layer{i}" for kind in KINDS for i in range(LAYERS[kind])}
    assert set(events.Tags()["images"]) == expected
    for tag in expected:
        images = events.Images(tag)
        assert [image.step for image in images] == [25, 50], tag  # the end is not doubled
        for image in images:
            width, height = png_size(image.encoded_image_string)
            assert (width, height) == (image.width, image.height)
            # two heads side by side, tokens on the axes, a colour bar: wider than tall
            assert 400 <= width <= 2000 and 250 <= height <= 1000, (tag, width, height)


def test_attention_image_decodes_as_colour_png(run):
    import io

    import matplotlib.image

    _, _, events = run
    data = events.Images("attention/cross/layer1")[-1].encoded_image_string
    pixels = matplotlib.image.imread(io.BytesIO(data), format="png")  # (H, W, 3) in [0, 1]
    assert pixels.ndim == 3 and pixels.shape[2] in (3, 4)
    assert pixels[..., :3].std(axis=2).max() > 0.2  # a colour map, not grey


def test_config_and_samples_text(run):
    _, _, events = run
    assert {"config/text_summary", "samples/text_summary"} <= set(events.Tags()["tensors"])
    config = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "n_symbols: 5" in config and config.startswith("```")
    samples = events.Tensors("samples/text_summary")
    assert [s.step for s in samples] == [25, 50]
    table = samples[-1].tensor_proto.string_val[0].decode()
    assert table.startswith("| input | target | prediction | ok |")
    assert len(table.splitlines()) == 2 + 5


def test_hparams_with_final_metrics_in_the_same_run(run):
    run_dir, summary, events = run
    # No stray run: every event file lies in the run directory itself.
    assert {p.parent for p in run_dir.rglob("events.out.tfevents.*")} == {run_dir}
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["model.n_decoder_layers"].number_value == 2
    assert start.hparams["task.name"].string_value == "copy"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]).experiment
    metrics = {m.name.tag for m in experiment.metric_infos}
    assert metrics == {"hparam/exact_match", "hparam/token_accuracy", "hparam/loss"}
    final = events.Scalars("hparam/exact_match")
    assert [(e.step, round(e.value, 6)) for e in final] == [(50, round(summary["exact_match"], 6))]


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
def test_tensorboard_server_serves_images_and_scalars(run, tmp_path):
    run_dir, _, _ = run
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
        assert "attention/cross/layer0" in tags, tags
        images = json.loads(get(port, "/data/plugin/images/images", run=run_dir.name,
                                tag="attention/cross/layer0", sample=0))
        assert [image["step"] for image in images] == [25, 50]
        blob = get(port, "/data/plugin/images/individualImage?" + images[-1]["query"])
        assert png_size(blob)[0] >= 400
        scalars = json.loads(get(port, "/data/plugin/scalars/scalars", run=run_dir.name,
                                 tag="train/loss"))
        assert [step for _, step, _ in scalars] == list(range(10, 51, 10))
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
