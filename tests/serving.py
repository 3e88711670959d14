"""lorm-serve's real HTTP service (uvicorn with its configuration, plain HTTP on a free loopback port) in a thread of
the test's process, over a model slot: what a test needs to ask the server itself, in a fraction of a second."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from common.infra.tls import Security
from serve.app import Identities, Limits, create_app
from serve.main import uvicorn_config
from serve.watch import ModelSlot


@contextlib.contextmanager
def serving_slot(slot: ModelSlot[Any], max_batch: int = 32, **limits: int) -> Iterator[tuple[int, Any]]:
    """The service over ``slot`` with ``limits`` (the rest their defaults) until the block ends: its port and app."""
    app = create_app(slot, max_batch=max_batch, max_wait_s=0.001, poll_s=0, limits=Limits(**limits))
    server = uvicorn.Server(uvicorn_config(app, Security(insecure=True), Identities()))
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "lorm-serve did not start"
        time.sleep(0.01)
    try:
        yield listener.getsockname()[1], app
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def post_predict(port: int, body: dict | bytes) -> tuple[int, Any]:
    """``POST /v1/predict``: the status and the JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/predict", body=data, headers={"content-type": "application/json"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    return response.status, answer
