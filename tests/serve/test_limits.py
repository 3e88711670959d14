"""lorm-serve against requests built to exhaust it: an oversized body, an over-long string, a decompression
bomb, too many inputs, a full queue, an image that breaks the decoder. Each is refused with its status and a
message naming the bound's flag, before what it would make the server hold exists, and the server answers
the next normal request. The server is the real one (uvicorn with lorm-serve's configuration, plain HTTP on a
free port) over a stand-in model, so that each test takes a fraction of a second."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.client
import io
import json
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from PIL import Image, PngImagePlugin
from serving import serving_slot

from client.classifier import build_model, model_spec
from common.wire.messages import LowRank
from common.wire.model_card import CARD_FILE
from serve.app import Limits
from serve.batcher import MicroBatcher, QueueFull
from serve.main import build_parser, limits_from_args, main
from serve.model import Classifier, Prediction
from serve.watch import ModelSlot
from server.export import export_adapter, export_card, export_head, model_card

from exports import image_config

INPUT = (8, 8)  # the stand-in model's input size, in pixels


class Model:
    """A stand-in for :class:`serve.model.Classifier`: every sample is class 0. It records what it was given
    (``prepared``: images as decoded, ``seen``: samples as batched) and, while ``gate`` is clear, holds its
    batch (``entered`` says one is running)."""

    def __init__(self, kind: str = "text") -> None:
        self.kind = kind
        self.card = SimpleNamespace(run_id="limits", tasks_trained=1)
        self.prepared: list[tuple[int, int]] = []
        self.seen: list[Any] = []
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def prepare(self, image: Image.Image) -> Image.Image:
        self.prepared.append(image.size)
        return image.resize(INPUT)

    def predict(self, samples: list[Any]) -> list[Prediction]:
        self.seen.extend(samples)
        self.entered.set()
        assert self.gate.wait(10)
        return [Prediction(0, "zero", 1.0) for _ in samples]


@dataclass
class Served:
    port: int
    model: Model
    app: Any

    def post(self, body: dict | bytes, chunked: bool = False) -> tuple[int, Any, dict[str, str]]:
        """``POST /v1/predict``: the status, the JSON error's ``detail`` (or the whole JSON answer), the headers."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"content-type": "application/json"}
        if chunked:
            pieces = (data[i : i + 4096] for i in range(0, len(data), 4096))
            conn.request("POST", "/v1/predict", body=pieces, headers=headers, encode_chunked=True)
        else:
            conn.request("POST", "/v1/predict", body=data, headers=headers)
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        return response.status, answer.get("detail", json.dumps(answer)), dict(response.getheaders())

    def answers_normally(self) -> None:
        body = {"images": [png((40, 30))]} if self.model.kind == "image" else {"inputs": ["wake me up at six"]}
        status, answer, _ = self.post(body)
        assert status == 200 and json.loads(answer)["predictions"][0]["label"] == "zero", answer


@contextlib.contextmanager
def serving(tmp_path: Path, model: Model, max_batch: int = 32, **limits: int) -> Iterator[Served]:
    """lorm-serve over ``model`` with ``limits`` (the rest their defaults), in a thread, until the block ends."""
    (tmp_path / CARD_FILE).write_text("{}")  # the slot loads an export where it finds a card
    with serving_slot(ModelSlot(tmp_path, lambda _: model), max_batch, **limits) as (port, app):
        yield Served(port, model, app)


def png(size: tuple[int, int]) -> str:
    """The base64 of a black PNG of ``size``."""
    buffer = io.BytesIO()
    Image.new("RGB", size).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def black_png(width: int, height: int) -> str:
    """The base64 of an all-black bilevel PNG, written row by row (PIL would hold a byte a pixel to save it):
    a valid image, and a bomb, since its zeros compress about 1000 to 1."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    squeeze = zlib.compressobj(9)
    row = bytes(1 + -(-width // 8))  # filter byte 0, then a bit a pixel
    pixels = b"".join(squeeze.compress(row * 1000) for _ in range(height // 1000))
    pixels += squeeze.compress(row * (height % 1000)) + squeeze.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # bit depth 1, grey-scale
    raw = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    with PngImagePlugin.PngImageFile(io.BytesIO(raw)) as image:  # PIL reads it as what it claims, unchecked
        assert image.size == (width, height) and image.mode == "1"
    return base64.b64encode(raw).decode()


def lying_bmp(width: int, height: int) -> str:
    """A 1 x 1 BMP whose header claims ``width x height``: 58 bytes that would decode to gigabytes."""
    buffer = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buffer, format="BMP")
    raw = bytearray(buffer.getvalue())
    raw[18:26] = struct.pack("<ii", width, height)
    return base64.b64encode(bytes(raw)).decode()


def png_bytes() -> bytes:
    return base64.b64decode(png((5, 4)))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_oversized_body_is_refused_before_it_is_held(tmp_path, chunked):
    with serving(tmp_path, Model(), max_body_bytes=64 << 10) as served:
        body = {"inputs": ["a sentence of a thousand characters " * 28] * 100}  # 100 KB, each input valid
        status, detail, _ = served.post(body, chunked=chunked)
        assert status == 413 and "more than the 65536 this server takes (--max-body-bytes)" in detail, detail
        assert served.model.seen == []
        served.answers_normally()


@pytest.mark.parametrize(
    "kind, body, status, message",
    [
        ("text", {"inputs": ["fine", "x" * 101]}, 422, "input 1: 101 characters, more than the 100 of a sentence"),
        ("image", {"images": [png((5, 4)), "A" * 1400]}, 413, "image 1: 1400 characters of base64, more than the"),
    ],
    ids=["sentence", "image"],
)
def test_an_over_long_string_is_refused_with_its_place(tmp_path, kind, body, status, message):
    flag = "--max-chars" if kind == "text" else "--max-image-bytes"
    with serving(tmp_path, Model(kind), max_chars=100, max_image_bytes=1000) as served:
        got, detail, _ = served.post(body)
        assert got == status and message in detail and flag in detail, detail
        assert served.model.seen == [] and served.model.prepared == []
        served.answers_normally()


@pytest.mark.parametrize(
    "bomb, size",
    [
        (lambda: black_png(9000, 9000), "9000 x 9000 = 81000000 pixels"),  # 10 KB, 243 MB as RGB: PIL only warns
        (lambda: black_png(15000, 15000), "Image size (225000000 pixels)"),  # 27 KB, past PIL's own bound
        (lambda: lying_bmp(50_000, 50_000), "Image size (2500000000 pixels)"),
    ],
    ids=["81-megapixel-png", "225-megapixel-png", "lying-bmp-header"],
)
def test_a_decompression_bomb_is_refused_from_its_header(tmp_path, bomb, size):
    with serving(tmp_path, Model("image")) as served:
        status, detail, _ = served.post({"images": [png((5, 4)), bomb()]})
        assert status == 413 and detail.startswith("image 1: ") and size in detail, detail
        assert "more than the 16777216 pixels this server decodes (--max-image-pixels)" in detail
        assert served.model.prepared == [(5, 4)] and served.model.seen == []  # the bomb itself never decoded
        served.answers_normally()


def test_an_image_is_held_at_the_models_input_size_from_its_decoding(tmp_path):
    with serving(tmp_path, Model("image")) as served:
        status, _, _ = served.post({"images": [png((3000, 2000)), png((5, 4))]})
        assert status == 200 and served.model.prepared == [(3000, 2000), (5, 4)]
        assert [image.size for image in served.model.seen] == [INPUT, INPUT]  # what waited for the batch


@pytest.mark.parametrize("kind", ["text", "image"])
def test_a_request_of_too_many_inputs_is_refused_before_any_is_decoded(tmp_path, kind):
    with serving(tmp_path, Model(kind), max_inputs=4) as served:
        body = {"images": [png((5, 4))] * 5} if kind == "image" else {"inputs": ["hello"] * 5}
        status, detail, _ = served.post(body)
        what = "images" if kind == "image" else "sentences"
        assert status == 422 and f"5 {what}, more than the 4 a request may hold (--max-inputs)" in detail, detail
        assert served.model.prepared == [] and served.model.seen == []
        status, answer, _ = served.post({key: values[:4] for key, values in body.items()})
        assert status == 200 and len(json.loads(answer)["predictions"]) == 4


def test_a_full_queue_answers_503_with_retry_after_and_decodes_nothing(tmp_path):
    model = Model("image")
    with serving(tmp_path, model, max_batch=2, max_inputs=4, max_queue=4) as served:
        model.gate.clear()  # the first batch runs until the test opens the gate
        first: list = []
        holder = threading.Thread(target=lambda: first.append(served.post({"images": [png((5, 4))] * 4})))
        holder.start()
        assert model.entered.wait(5)  # 2 images in the running batch, 2 waiting: the queue holds its 4
        status, detail, headers = served.post({"images": [png((5, 4))]})
        assert status == 503 and headers["retry-after"] == "1", (status, detail)
        assert "the queue holds 4 samples and takes 4 at most: 1 more do not fit now (--max-queue)" in detail
        assert len(model.prepared) == 4  # the refused image was never decoded
        model.gate.set()
        holder.join(10)
        assert first[0][0] == 200 and len(json.loads(first[0][1])["predictions"]) == 4
        served.answers_normally()
        assert served.app.state.batcher.held == 0


@pytest.mark.parametrize(
    "raw, error",
    [
        (png_bytes()[:11] + b"\x00" + png_bytes()[12:], "ValueError"),  # an IHDR chunk of length 0
        (png_bytes()[:36] + b"\x00" + png_bytes()[37:], "SyntaxError"),  # a chunk whose type is not a name
    ],
    ids=["empty-header-chunk", "broken-chunk"],
)
def test_an_image_that_breaks_the_decoder_is_its_requests_422_not_a_500(tmp_path, raw, error):
    with serving(tmp_path, Model("image")) as served:
        status, detail, _ = served.post({"images": [png((5, 4)), base64.b64encode(raw).decode()]})
        assert status == 422 and detail.startswith(f"image 1: not an image this server reads ({error}"), detail
        served.answers_normally()


def test_a_list_of_many_wrong_items_is_one_error_not_one_each(tmp_path):
    with serving(tmp_path, Model()) as served:
        status, errors, _ = served.post(('{"inputs": [' + ",".join(["{}"] * 300_000) + "]}").encode())
        assert status == 422 and len(errors) == 1, errors[:2]  # each error echoes its item: a million would be GBs
        assert errors[0]["loc"] == ["body", "inputs", 0] and errors[0]["type"] == "string_type"
        served.answers_normally()


def test_the_queue_counts_a_request_from_admission_to_its_answer():
    def refuse(samples: Any) -> list:
        raise ValueError("not an image")

    async def run() -> list[int]:
        batcher = MicroBatcher(lambda samples: [2 * s for s in samples], max_batch=2, max_queue=3)
        batcher.start()
        try:
            held = []
            with pytest.raises(ValueError, match="not an image"):
                await batcher.submit([1, 2], prepare=refuse)
            held.append(batcher.held)
            waiting = asyncio.ensure_future(batcher.submit([1, 2, 3], prepare=lambda s: [*s]))
            await asyncio.sleep(0)
            with pytest.raises(QueueFull):
                await batcher.submit([4])
            held.append(batcher.held)
            assert await waiting == [2, 4, 6]
            held.append(batcher.held)
            return held
        finally:
            await batcher.stop()

    assert asyncio.run(run()) == [0, 3, 0]


def test_every_limit_is_a_flag_with_a_default_a_laptop_survives(tmp_path, capsys):
    args = build_parser().parse_args(["--models", str(tmp_path), "--insecure"])
    assert limits_from_args(args) == Limits()
    assert Limits().max_body_bytes <= 16 << 20 and Limits().max_queue * 3 * 224 * 224 * 4 <= 512 << 20
    argv = ["--models", str(tmp_path), "--insecure", "--max-body-bytes", "1000", "--max-image-pixels", "4096"]
    assert limits_from_args(build_parser().parse_args(argv)) == Limits(max_body_bytes=1000, max_image_pixels=4096)
    for bad, message in [
        (["--max-inputs", "16", "--max-queue", "8"], "--max-inputs 16 is more than --max-queue 8"),
        (["--max-body-bytes", "0"], "each limit must be at least 1, got --max-body-bytes 0"),
    ]:
        with pytest.raises(SystemExit) as refused:
            main(["--models", str(tmp_path), "--insecure", *bad])
        assert refused.value.code == 2 and message in capsys.readouterr().err


def image_export(path: Path) -> Path:
    """A hand-made export of tiny-vit (16 pixels) with random factors and head, as the coordinator writes one."""
    classes = ["dark", "light", "red", "blue"]
    config = image_config(path / "unused", classes, rank=1)
    spec = model_spec(build_model(config, len(classes)), tuple(classes), 0)
    gen = torch.Generator().manual_seed(0)
    head_w, head_b = torch.randn(4, spec.feature_dim, generator=gen), torch.randn(4, generator=gen)
    factors = {
        n: LowRank(torch.randn(o, 1, generator=gen) / 4, torch.randn(1, i, generator=gen) / 4)
        for n, (o, i) in spec.layers.items()
    }
    export_adapter(path / "adapter", factors, spec, rank_per_task=1, lora_scale=config.lora_scale)
    export_head(path, head_w, head_b)
    export_card(path, model_card(config, spec, head_w, weights="adapter", tasks_trained=2, parts=[]))
    return path


def test_an_image_prepared_at_decoding_scores_as_the_image_itself(tmp_path):
    served = Classifier(image_export(tmp_path))
    images = [Image.new("RGB", (300, 200), (200, 30, 40)), Image.radial_gradient("L").convert("RGB")]
    prepared = [served.prepare(image) for image in images]
    assert [tuple(p.shape) for p in prepared] == [(3, 16, 16)] * 2
    assert torch.equal(served.probabilities(served.encode(prepared)), served.probabilities(served.encode(images)))
