"""The client's run over a transport of another kind: :class:`client.session.ClientSession` over the in-process
transport (``engine/transport.py``), three clients in threads against one real ``Coordinator``.

The same configuration as the gRPC run of ``tests/integration/test_distributed.py``, and the same result: the
in-process engine's, bit for bit (adapter and accuracy counts). So the session is the client's whole part in a run,
whatever carries its calls; and a secure run (honest mode, four clients) finishes the same way."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
import torch
from safetensors.torch import load_file

from client.runtime import build_runtime
from client.session import ClientOptions, ClientSession
from common.infra import logs
from common.infra.tls import Security
from common.run.config import RunConfig
from engine.simulation import run_inprocess
from engine.transport import Hub, InProcessTransport
from server.checks import Options
from server.coordinator import Coordinator
from server.export import export_adapter

CONFIG = RunConfig(
    run_id="session",
    num_clients=3,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=9,
    extra={"synthetic_classes": 8, "synthetic_train": 30, "synthetic_test": 10},
)
ADAPTER = "adapter/adapter_model.safetensors"


class OneAtATime(ClientSession):
    """Clients in one process share torch's global generator, which building a model (the tiny backbone's random
    weights) and each step seed before they draw: two at once would draw from each other's stream. So here one
    builds or computes at a time (each in its own process, as lorm-client runs, needs no lock)."""

    computing = threading.Lock()

    def setup(self) -> None:
        with self.computing:
            super().setup()

    def _compute(self, plan):
        with self.computing:
            return super()._compute(plan)


def sessions_run(config: RunConfig, tmp_path) -> tuple[list[int], Coordinator]:
    """Every client's session in its own thread, against one coordinator: their exit codes, and the coordinator."""
    coord = Coordinator(config, tmp_path / "state", Options(results_dir=tmp_path / "results"))
    codes: list[int] = [-1] * config.num_clients
    hub = Hub(coord)

    def client(i: int) -> None:
        options = ClientOptions(client_id=f"client-{i}", index=i, security=Security(insecure=True))
        codes[i] = OneAtATime(InProcessTransport(hub, f"client-{i}"), options).run()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(config.num_clients)]
    with logs.context_kept():  # the sessions set the process's log context, as the engine's do
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a client session did not finish within 300 s"
    return codes, coord


def reference(config: RunConfig, tmp_path) -> tuple[object, dict]:
    result = run_inprocess(config)
    out = tmp_path / "inprocess"
    export_adapter(out / "adapter", result.adapter, build_runtime(config).spec, rank_per_task=config.rank)
    return result, load_file(str(out / ADAPTER))


@pytest.mark.parametrize("secure", [False, True], ids=["plain", "secure"])
def test_client_sessions_over_the_in_process_transport_give_the_engines_result(tmp_path, secure):
    config = CONFIG
    if secure:  # four clients, threshold 3: the secure rounds through the same session code as lorm-client's
        config = CONFIG.replace(num_clients=4, settings={"secagg": {"enabled": True}})
    expected, adapter = reference(config, tmp_path)  # first: transformers' lazy imports are not thread-safe
    codes, coord = sessions_run(config, tmp_path)
    assert codes == [0] * config.num_clients
    matrix = coord.run.matrix
    assert (matrix.correct, matrix.total) == (expected.matrix.correct, expected.matrix.total)
    got = load_file(str(tmp_path / "results" / ADAPTER))
    assert got.keys() == adapter.keys() and all(torch.equal(got[k], adapter[k]) for k in adapter)
    if secure:
        assert all(h["secagg"]["survivors"] == 4 for h in coord.run.history if "secagg" in h)


def test_an_in_process_run_leaves_the_process_log_context_as_it_was():
    """Each in-process client sets the process's log context (run, task, round) in its thread; the caller's records
    carry their own context again once the run returns."""
    stream = io.StringIO()
    logs.setup_logging("json", stream=stream)
    logs.set_context(run="the-callers", task=None, round=None)
    try:
        run_inprocess(CONFIG.replace(num_tasks=1, rounds_per_task=1))
        logging.getLogger("lorm.test").info("after")
    finally:
        logs.set_context(run=None)
        logs.setup_logging("plain")
    record = json.loads(stream.getvalue().splitlines()[-1])
    assert record["msg"] == "after" and record["run"] == "the-callers" and "task" not in record
