"""The inference service: JSON in and out over HTTP (FastAPI), requests batched together, the newest export.

- ``POST /v1/predict``: ``{"inputs": ["a sentence", ...]}`` (a text model) or ``{"images": ["<base64>", ...]}``
  (an image model, any format PIL reads) -> ``{"predictions": [{"label", "score", "index"}, ...], "model":
  {...}}``, one prediction per input, in order;
- ``GET /v1/model``: the model in use (its run, tasks learned, classes) and the batch sizes run so far;
- ``GET /health``: 200 ``{"status": "SERVING"}`` with a model, 503 ``NOT_SERVING`` (and why) before one.

Callers are authenticated as the coordinator's clients are (``common/infra/tls.py``): by their certificate
(checked when the connection is made, ``serve/main.py``) and/or a bearer token (checked here, per request).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, Field

from common.infra.tls import token_digest
from serve.batcher import MicroBatcher
from serve.model import Classifier, Prediction
from serve.watch import ModelSlot

log = logging.getLogger("lorm.serve")
MAX_INPUTS = 1024  # samples per request: a bound on what one caller holds in the queue
MAX_CHARS = 20_000  # characters per sentence (the tokenizer keeps max_length tokens of it anyway)
MAX_IMAGE_BYTES = 20 << 20  # base64-decoded bytes per image


class PredictRequest(BaseModel):
    inputs: list[Annotated[str, Field(max_length=MAX_CHARS)]] = Field(default_factory=list, max_length=MAX_INPUTS)
    images: list[str] = Field(default_factory=list, max_length=MAX_INPUTS)  # base64 of an image file's bytes


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
) -> FastAPI:
    """The service over ``slot`` (polled every ``poll_s`` seconds for a newer export; 0: never).

    ``token_digests``: ``{client_id: sha256 hex of its token}`` (``--token-file``): every predict call needs
    ``Authorization: Bearer <token>``. ``allowed``: the only identities admitted (empty: any authenticated).
    ``identities``: the certificate identities of the open connections (mutual TLS)."""
    holders = {digest: client for client, digest in (token_digests or {}).items()}

    def run(samples: list[Any]) -> list[tuple[Prediction, dict[str, Any]]]:
        model, version = slot.current, slot.version  # one model for the whole batch, even while one is loaded
        if model is None:
            raise RuntimeError("no model loaded")
        return [(p, {"version": version}) for p in model.predict(samples)]

    batcher: MicroBatcher[tuple[Prediction, dict[str, Any]]] = MicroBatcher(run, max_batch, max_wait_s)

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
    app.state.batcher, app.state.slot = batcher, slot

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
        samples: list[Any] = list(body.inputs) if body.inputs else await asyncio.to_thread(_decode, body.images)
        try:
            scored = await batcher.submit(samples)
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


def _decode(images: list[str]) -> list[Image.Image]:
    """Each base64 image decoded here, per request: a bad one fails its own request (422), not a batch."""
    decoded = []
    for i, text in enumerate(images):
        try:
            raw = base64.b64decode(text, validate=True)
            if len(raw) > MAX_IMAGE_BYTES:
                raise HTTPException(413, f"image {i}: {len(raw)} bytes, more than {MAX_IMAGE_BYTES}")
            with Image.open(io.BytesIO(raw)) as image:
                decoded.append(image.convert("RGB"))
        except (binascii.Error, UnidentifiedImageError, OSError) as err:
            raise HTTPException(422, f"image {i}: not a base64-encoded image ({err})") from err
    return decoded


async def _watch(slot: ModelSlot[Classifier], every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(slot.poll)
        except Exception:  # the watcher outlives any one failure
            log.exception("polling %s failed", slot.root)
