"""The inference service: JSON in and out over HTTP (FastAPI), requests batched together, the newest export.

- ``POST /v1/predict``: ``{"inputs": ["a sentence", ...]}`` (a text model) or ``{"images": ["<base64>", ...]}``
  (an image model, any format PIL reads) -> ``{"predictions": [{"label", "score", "index"}, ...], "model":
  {...}}``, one prediction per input, in order;
- ``GET /v1/model``: the model in use (its run, tasks learned, classes) and the batch sizes run so far;
- ``GET /health``: 200 ``{"status": "SERVING"}`` with a model, 503 ``NOT_SERVING`` (and why) before one.

Callers are authenticated as the coordinator's clients are (``common/infra/tls.py``): by their certificate
(checked when the connection is made, ``serve/main.py``) and/or a bearer token (checked here, per request).

What one request may make the server hold is bounded (:class:`Limits`), each bound checked before what it
bounds is allocated: the body as it arrives (413), the count and length of its strings (422, 413), an
image's pixels from its header before it is decoded (413), and the samples queued across requests (503 with
``Retry-After``). A decoded image is reduced to the model's input at once, so a large one is held only while
it is decoded. A malformed input is its own request's 422, never a 500.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from PIL import Image
from pydantic import BaseModel, FailFast, Field
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.infra.tls import token_digest
from serve.batcher import MicroBatcher, QueueFull
from serve.model import Classifier, Prediction
from serve.watch import ModelSlot

log = logging.getLogger("lorm.serve")
RETRY_AFTER_S = 1  # a full queue drains in a few batches: a second is long enough to find room


@dataclass(frozen=True)
class Limits:
    """What requests may make the server hold; each field is the ``lorm-serve`` flag of its name
    (``max_body_bytes``: ``--max-body-bytes``). The defaults fit a laptop: an image being decoded takes about
    4 bytes a pixel (64 MB at most), a prepared one waiting in the queue 600 KB (3 x 224 x 224 floats)."""

    max_body_bytes: int = 8 << 20  # a request's body: a few images or many sentences, 413 beyond
    max_inputs: int = 256  # samples (sentences or images) per request, 422 beyond
    max_queue: int = 512  # samples held across requests (prepared, waiting or running); 503 beyond: 300 MB of images
    max_chars: int = 20_000  # characters per sentence (the tokenizer keeps max_length tokens of it anyway)
    max_image_bytes: int = 4 << 20  # an image file's bytes; its base64 string may be 4/3 as long, 413 beyond
    max_image_pixels: int = 1 << 24  # width x height (a 12 MP photo passes), read from the header before decoding

    def __post_init__(self) -> None:
        small = [f"{flag(f.name)} {getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name) < 1]
        if small:
            raise ValueError(f"each limit must be at least 1, got {', '.join(small)}")
        if self.max_inputs > self.max_queue:
            raise ValueError(
                f"--max-inputs {self.max_inputs} is more than --max-queue {self.max_queue}: a request that large "
                "could never be admitted"
            )

    @property
    def max_base64(self) -> int:
        """The longest base64 string of a file of ``max_image_bytes``."""
        return 4 * -(-self.max_image_bytes // 3)


def flag(name: str) -> str:
    """The command-line flag of a :class:`Limits` field."""
    return "--" + name.replace("_", "-")


class BodyLimit:
    """Refuses (413) a request body over ``max_bytes``: by its Content-Length before any of it is read, else
    (chunked) as soon as what has come passes it, so that no more than ``max_bytes`` of a body is ever held."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            refusal = JSONResponse({"detail": self._message(f"is {int(declared)} bytes")}, status_code=413)
            await refusal(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # an HTTPException: FastAPI passes it on from its body read (others: 400)
                raise HTTPException(413, self._message(f"passed {self.max_bytes} bytes"))
            return message

        await self.app(scope, limited, send)

    def _message(self, size: str) -> str:
        return f"the request body {size}, more than the {self.max_bytes} this server takes (--max-body-bytes)"


class PredictRequest(BaseModel):
    # FailFast: one error for a list of a million wrong items, not a million (seconds and gigabytes to report)
    inputs: Annotated[list[str], FailFast()] = Field(default_factory=list)  # sentences
    images: Annotated[list[str], FailFast()] = Field(default_factory=list)  # base64 of an image file's bytes


class Scored(BaseModel):
    label: str
    score: float  # the class's probability among the classes learned so far
    index: int  # its row of the head (its place in the export's class list)


class PredictResponse(BaseModel):
    predictions: list[Scored]
    model: dict[str, Any]


class Identities:
    """Who holds each open connection, as the connection's certificate said (``serve/main.py`` fills it)."""

    def __init__(self) -> None:
        self.by_peer: dict[tuple[str, int], str] = {}


def create_app(
    slot: ModelSlot[Classifier],
    *,
    max_batch: int = 32,
    max_wait_s: float = 0.005,
    poll_s: float = 2.0,
    token_digests: dict[str, str] | None = None,
    allowed: frozenset[str] = frozenset(),
    identities: Identities | None = None,
    limits: Limits | None = None,
) -> FastAPI:
    """The service over ``slot`` (polled every ``poll_s`` seconds for a newer export; 0: never).

    ``token_digests``: ``{client_id: sha256 hex of its token}`` (``--token-file``): every predict call needs
    ``Authorization: Bearer <token>``. ``allowed``: the only identities admitted (empty: any authenticated).
    ``identities``: the certificate identities of the open connections (mutual TLS). ``limits``: what requests
    may make it hold (default :class:`Limits`)."""
    limits = limits or Limits()
    holders = {digest: client for client, digest in (token_digests or {}).items()}

    def run(samples: list[Any]) -> list[tuple[Prediction, dict[str, Any]]]:
        model, version = slot.current, slot.version  # one model for the whole batch, even while one is loaded
        if model is None:
            raise RuntimeError("no model loaded")
        return [(p, {"version": version}) for p in model.predict(samples)]

    batcher: MicroBatcher[tuple[Prediction, dict[str, Any]]] = MicroBatcher(
        run, max_batch, max_wait_s, limits.max_queue
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(slot.poll)
        batcher.start()
        watcher = asyncio.create_task(_watch(slot, poll_s)) if poll_s > 0 else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await batcher.stop()

    app = FastAPI(title="lorm-serve", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes)
    app.state.batcher, app.state.slot, app.state.limits = batcher, slot, limits

    def caller(request: Request) -> str | None:
        """The authenticated caller (``None`` where nobody is authenticated); 401/403 otherwise."""
        who = identities.by_peer.get(_peer(request)) if identities is not None else None
        if holders:
            header = request.headers.get("authorization", "")
            token = header[len("Bearer ") :].strip() if header.startswith("Bearer ") else ""
            if not token:
                raise HTTPException(401, "missing 'Authorization: Bearer <token>' header")
            holder = holders.get(token_digest(token))
            if holder is None:
                raise HTTPException(401, "unknown bearer token")
            if who is not None and who != holder:
                raise HTTPException(403, f"the certificate names client {who!r} but the token belongs to {holder!r}")
            who = holder
        if allowed and who not in allowed:
            raise HTTPException(403, f"client {who!r} is not admitted")
        return who

    @app.get("/health")
    async def health() -> JSONResponse:
        if slot.current is None:
            return JSONResponse({"status": "NOT_SERVING", "error": slot.error}, status_code=503)
        return JSONResponse({"status": "SERVING", "version": slot.version})

    @app.get("/v1/model", dependencies=[Depends(caller)])
    async def model_info() -> dict[str, Any]:
        model = _serving(slot)
        sizes = dict(sorted(batcher.sizes.items()))
        return {**model.describe(), "version": slot.version, "error": slot.error, "batch_sizes": sizes}

    @app.post("/v1/predict", dependencies=[Depends(caller)])
    async def predict(body: PredictRequest) -> PredictResponse:
        model = _serving(slot)
        if bool(body.inputs) == bool(body.images):
            raise HTTPException(422, "send either 'inputs' (sentences) or 'images' (base64), not both or neither")
        if body.images and model.kind != "image" or body.inputs and model.kind != "text":
            raise HTTPException(422, f"the model in use classifies {'sentences' if model.kind == 'text' else 'images'}")
        _refuse_oversized(body, limits)
        prepare = partial(_decode, limits=limits, prepare=model.prepare) if body.images else None
        try:
            scored = await batcher.submit(body.inputs or body.images, prepare)
        except QueueFull as err:
            retry = {"Retry-After": str(RETRY_AFTER_S)}
            raise HTTPException(503, f"{err} (--max-queue); retry in {RETRY_AFTER_S} s", headers=retry) from err
        except RuntimeError as err:
            raise HTTPException(503, str(err)) from err
        return PredictResponse(
            predictions=[Scored(label=p.label, score=p.score, index=p.index) for p, _ in scored],
            model={**_brief(model), **scored[0][1]},
        )

    return app


def _serving(slot: ModelSlot[Classifier]) -> Classifier:
    if slot.current is None:
        raise HTTPException(503, f"no model loaded: {slot.error}")
    return slot.current


def _brief(model: Classifier) -> dict[str, Any]:
    return {"run_id": model.card.run_id, "tasks_trained": model.card.tasks_trained}


def _peer(request: Request) -> tuple[str, int]:
    return (request.client.host, request.client.port) if request.client else ("", 0)


def _refuse_oversized(body: PredictRequest, limits: Limits) -> None:
    """Too many samples (422), a sentence too long (422) or an image's base64 too long (413), before any of
    them is admitted to the queue or decoded."""
    samples, what = (body.inputs, "sentences") if body.inputs else (body.images, "images")
    if len(samples) > limits.max_inputs:
        raise HTTPException(
            422, f"{len(samples)} {what}, more than the {limits.max_inputs} a request may hold (--max-inputs)"
        )
    for i, text in enumerate(body.inputs):
        if len(text) > limits.max_chars:
            raise HTTPException(
                422, f"input {i}: {len(text)} characters, more than the {limits.max_chars} of a sentence (--max-chars)"
            )
    for i, text in enumerate(body.images):
        if len(text) > limits.max_base64:
            raise HTTPException(
                413,
                f"image {i}: {len(text)} characters of base64, more than the {limits.max_base64} of a "
                f"{limits.max_image_bytes}-byte file (--max-image-bytes)",
            )


def _keep(image: Image.Image) -> Any:
    return image


def _decode(
    images: Sequence[str], limits: Limits | None = None, prepare: Callable[[Image.Image], Any] = _keep
) -> list[Any]:
    """Each base64 image decoded, one at a time, and made ``prepare``'s (the model's input) at once, so that
    only that is held until the batch runs. A bad one fails its own request (422), not a batch; one of more
    than ``max_image_pixels`` is refused (413) from its header, before it is decoded."""
    limits = limits or Limits()
    decoded = []
    for i, text in enumerate(images):
        try:
            raw = base64.b64decode(text, validate=True)
        except binascii.Error as err:
            raise HTTPException(422, f"image {i}: not a base64-encoded image ({err})") from err
        decoded.append(_open(i, raw, limits.max_image_pixels, prepare))
    return decoded


def _open(i: int, raw: bytes, max_pixels: int, prepare: Callable[[Image.Image], Any]) -> Any:
    refusal = f"more than the {max_pixels} pixels this server decodes (--max-image-pixels)"
    try:
        with Image.open(io.BytesIO(raw)) as image:  # reads the header only
            width, height = image.size
            if width * height > max_pixels:
                raise HTTPException(413, f"image {i}: {width} x {height} = {width * height} pixels, {refusal}")
            return prepare(image.convert("RGB"))
    except HTTPException:
        raise
    except Image.DecompressionBombError as err:  # PIL's own bound, met before the header check can be
        raise HTTPException(413, f"image {i}: {refusal} ({err})") from err
    except Exception as err:  # a decoder fails on hostile bytes in many ways (OSError, SyntaxError, ValueError)
        raise HTTPException(422, f"image {i}: not an image this server reads ({type(err).__name__}: {err})") from err


async def _watch(slot: ModelSlot[Classifier], every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(slot.poll)
        except Exception:  # the watcher outlives any one failure
            log.exception("polling %s failed", slot.root)
