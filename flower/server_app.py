"""The Flower ServerApp: the project's coordinator (``server/coordinator.py``, the run's one driver) with its
clients reached through Flower's Grid instead of gRPC.

The run is the coordinator's: schedule, strategies, closed-form merges, fold policy, commits, history and export.
This app only carries its calls. A node joins as the client ``node-<id>`` (its identity is the node id the
SuperLink authenticated, never what a reply says of itself), and at each step the app pulls every node's plan from
the coordinator, sends the plans as one round of messages (``flower/records.py``), and hands each reply to the
coordinator as the gRPC service hands a push (the envelope checked against the node's identity and the open step
before any tensor is recorded) or a report. With a state directory the coordinator commits after every step, so a
ServerApp started again on it (a new ``flwr run``) resumes at the step it had reached, which Flower alone cannot.

Settings, in the run config (``--run-config`` or ``[tool.flwr.app.config]``): ``lorm-args`` (the run's
configuration as ``lorm-server``'s flags: ``--preset``, ``--config``, ``--set``, ``--task``, ``--open``),
``state-dir``, ``results-dir``, ``operator-address`` with ``operator-digest-file`` (``lorm-admin`` appends tasks to
an open run there, over TLS with ``operator-tls-cert`` and ``operator-tls-key``, or in plaintext only with
``operator-insecure = true``), ``step-timeout`` (seconds a step's round of messages may take) and ``nodes-timeout``
(seconds to wait for the federation's nodes).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from collections.abc import Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from client.runtime import process_settings_kept
from common.infra.logs import PlainFormatter
from common.infra.tls import Security
from common.methods.checks import validate
from common.run.arguments import add_config_arguments
from common.run.config import RunConfig
from common.run.schedule import add_schedule_arguments, config_with_schedule
from common.run.settings import SecAggSettings
from common.wire.messages import ModelSpec, Phase, RoundPlan
from flower import records
from proto import codec
from proto import lorm_pb2_grpc as pb_grpc
from server.checks import Options, Refused
from server.coordinator import Coordinator, use_run_threads
from server.operator import OperatorAuth
from server.run_state import State
from server.service import OperatorServicer
from server.state_lock import held
from server.store import MemoryStore, Store

log = logging.getLogger("lorm.flower")

SECURE_ON_FLOWER = (
    "secure aggregation runs on the native coordinator (lorm-server with its clients, or lorm-sim): its four "
    "rounds are calls inside a step that a client answers from keys it keeps, and a Flower ClientApp keeps nothing "
    "between messages on the deployment engine; Flower's own SecAgg+ is semi-honest and sums quantised model "
    "weights only"
)


class RunRefused(RuntimeError):
    """The run cannot go on over Flower: a setting it cannot carry, a node that refused or failed."""


@dataclass(frozen=True)
class Settings:
    config: RunConfig
    state_dir: str = ""
    results_dir: str = ""
    operator_address: str = ""
    operator_digest_file: str = ""
    operator_security: Security = Security(insecure=True)
    step_timeout_s: float = 3600.0
    nodes_timeout_s: float = 600.0


def settings(run_config: Mapping[str, Any]) -> Settings:
    """The app's settings from Flower's run config (``RunRefused`` for a run it cannot host)."""
    parser = argparse.ArgumentParser(prog="lorm on flower", add_help=False)
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    try:
        config = validate(config_with_schedule(parser.parse_args(shlex.split(str(run_config.get("lorm-args", ""))))))
    except (OSError, ValueError) as err:
        raise RunRefused(f"lorm-args: {err}") from err
    if config.section(SecAggSettings).enabled:
        raise RunRefused(SECURE_ON_FLOWER)
    operator = Security(
        cert=str(run_config.get("operator-tls-cert", "")),
        key=str(run_config.get("operator-tls-key", "")),
        insecure=_switch(run_config.get("operator-insecure", False)),
    )
    if operator.insecure and operator.cert:
        raise RunRefused("operator-insecure (plaintext) contradicts operator-tls-cert: pass one or the other")
    if run_config.get("operator-address") and not operator.insecure and not (operator.cert and operator.key):
        raise RunRefused(
            "operator-address needs operator-tls-cert and operator-tls-key (the operator's token is a secret), "
            "or operator-insecure = true for plaintext on a trusted network"
        )
    return Settings(
        config,
        state_dir=str(run_config.get("state-dir", "")),
        results_dir=str(run_config.get("results-dir", "")),
        operator_address=str(run_config.get("operator-address", "")),
        operator_digest_file=str(run_config.get("operator-digest-file", "")),
        operator_security=operator,
        step_timeout_s=float(run_config.get("step-timeout", 3600.0)),
        nodes_timeout_s=float(run_config.get("nodes-timeout", 600.0)),
    )


def _switch(value: object) -> bool:
    """A run config's switch: a TOML boolean, or its spelling in ``--run-config``."""
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no", ""):
        return False
    raise RunRefused(f"{value!r} is not a switch (true or false)")


class _Recorded(Exception):
    """The coordinator has this answer already: its tensors are not read again."""


class FlowerRelay:
    """The coordinator's calls of its clients, made as rounds of Flower messages over ``grid``."""

    def __init__(self, grid: Grid, coord: Coordinator, s: Settings) -> None:
        self.grid, self.coord, self.settings = grid, coord, s
        self.nodes: dict[int, str] = {}  # node id -> client id
        self.bytes_sent = self.bytes_received = 0

    def send(self, contents: Mapping[int, Any], message_type: str) -> dict[int, Message]:
        """One round: ``contents[node]`` to each node, and each node's reply (``RunRefused`` when a node refused,
        failed or did not answer in time)."""
        messages = [Message(content, dst_node_id=node, message_type=message_type) for node, content in contents.items()]
        replies: dict[int, Message] = {}
        for reply in self.grid.send_and_receive(messages, timeout=self.settings.step_timeout_s):
            node = reply.metadata.src_node_id
            if node not in contents or node in replies:
                raise RunRefused(f"a reply from node {node}, which was sent no {message_type} message")
            if reply.has_error():
                raise RunRefused(f"{records.client_id(node)} failed its {message_type} message: {reply.error.reason}")
            replies[node] = reply
        missing = sorted(set(contents) - set(replies))
        if missing:
            raise RunRefused(f"no {message_type} reply within {self.settings.step_timeout_s:g} s from {missing}")
        return replies

    def nodes_of_federation(self) -> list[int]:
        """The federation's nodes, once it has at least the run's ``num_clients`` (``RunRefused`` after
        ``nodes_timeout``)."""
        wanted, deadline = self.coord.config.num_clients, time.monotonic() + self.settings.nodes_timeout_s
        while True:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= wanted:
                return nodes
            if time.monotonic() > deadline:
                raise RunRefused(f"the federation has {len(nodes)} nodes; the run needs {wanted}")
            time.sleep(1.0)

    def join(self) -> None:
        """The run's nodes join (in the slots they ask for) and describe their model. Of a federation larger than
        the run, the nodes that ask for a slot of the run come first, then those that ask for none, by node id;
        the rest (a simulation's virtual nodes past ``num_clients``) take no part."""
        nodes = self.nodes_of_federation()
        asked = self.send({n: records.RecordDict() for n in nodes}, "query.hello")
        wanted = {n: records.integer(records.wire(asked[n].content), "index") for n in nodes}
        size = self.coord.config.num_clients
        order = sorted(nodes, key=lambda n: (not 0 <= wanted[n] < size, wanted[n] < 0, n))
        slots: dict[int, int] = {}
        for node in order[:size]:
            try:
                index = self.coord.join(records.client_id(node), None if wanted[node] < 0 else wanted[node])
            except Refused as err:
                raise RunRefused(f"{records.client_id(node)} cannot join: {err}") from err
            self.nodes[node] = records.client_id(node)
            slots[node] = index
        if len(nodes) > size:
            log.info("%d nodes of the federation take no part: the run has %d clients", len(nodes) - size, size)
        config, schedule = self.coord.joined()  # the run as it stands once every node holds its slot
        runs = {
            node: records.RecordDict({records.RUN: records.run_record(config, schedule, i)})
            for node, i in slots.items()
        }
        described = self.send(runs, "query.join")
        for node, reply in described.items():
            try:
                spec = ModelSpec.from_json(records.text(records.wire(reply.content), "spec"))
                self.coord.describe(self.nodes[node], spec)
            except (KeyError, TypeError, ValueError, IndexError) as err:
                raise RunRefused(f"{self.nodes[node]} described no usable model: {err}") from err

    def step(self) -> bool:
        """Hand every node its plan for the open step and the coordinator their answers; ``False`` once there is
        no plan to hand (the run is over, or an open run waits for the operator's next task)."""
        plans: dict[int, RoundPlan] = {}
        for node, cid in self.nodes.items():
            answer = self.coord.pull(cid)
            if isinstance(answer, RoundPlan) and answer.phase != Phase.DONE:
                plans[node] = answer
        if not plans:
            return False
        phases = {p.phase for p in plans.values()}
        if len(phases) != 1:
            raise RunRefused(f"the nodes' plans are of different steps: {sorted(p.value for p in phases)}")
        config, schedule = self.coord.joined()  # once a step: what every node's run record states
        index = self.coord.run.roster.index_of
        contents = {
            node: records.plan_content(plan, records.run_record(config, schedule, index(self.nodes[node])))
            for node, plan in plans.items()
        }
        self.bytes_sent += sum(len(b) for c in contents.values() for b in records.blobs(records.wire(c), "plan"))
        replies = self.send(contents, records.message_type(phases.pop()))
        for node in sorted(replies, key=lambda n: self.coord.run.roster.index_of(self.nodes[n])):
            self._hand_in(node, records.wire(replies[node].content))
        return True

    def _hand_in(self, node: int, record: Any) -> None:
        """A node's reply to the coordinator, as the gRPC service hands in a push or a report: its envelope checked
        against the node's identity and the open step before any tensor is recorded."""
        cid, coord = self.nodes[node], self.coord
        try:
            if "report" in record:
                key, report = codec.eval_from_proto(records.report_message(record))
                self.bytes_received += len(records.blobs(record, "report")[0])
                if report.client_id != cid:
                    raise Refused("PERMISSION_DENIED", f"a report of {report.client_id!r} from {cid}")
                coord.report_eval(report, key)
                return

            def on_envelope(env: Any) -> None:
                if env.client_id != cid:
                    raise Refused("PERMISSION_DENIED", f"a push of {env.client_id!r} from {cid}")
                if coord.precheck_push(env):
                    raise _Recorded()  # a resumed step's answer the coordinator had already staged

            self.bytes_received += sum(len(b) for b in records.blobs(record, "update"))
            envelope, update = codec.update_from_proto(
                records.update_chunks(record), on_envelope=on_envelope, max_total_bytes=coord.options.max_push_bytes
            )
            coord.submit(update, envelope.idempotency_key)
        except _Recorded:
            return
        except (Refused, ValueError, KeyError) as err:
            raise RunRefused(f"the coordinator refused {cid}'s answer: {err}") from err


def _operator_server(coord: Coordinator, s: Settings) -> grpc.Server | None:
    """The Operator service alone (``lorm-admin status``, ``add-task``, ``finish``), when the run config names an
    address and the token's digest, over TLS unless the run config asks for plaintext: the clients reach the run
    through Flower, not here."""
    if not s.operator_address:
        return None
    if not s.operator_digest_file:
        raise RunRefused("operator-address needs operator-digest-file (lorm-admin token writes it)")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_OperatorServicer_to_server(
        OperatorServicer(coord, OperatorAuth.from_file(s.operator_digest_file)), server
    )
    credentials = s.operator_security.server_credentials()
    try:
        port = (
            server.add_secure_port(s.operator_address, credentials)
            if credentials
            else server.add_insecure_port(s.operator_address)
        )
    except RuntimeError:  # gRPC's own says only "Failed to bind"
        port = 0
    if port == 0:
        raise RunRefused(f"operator-address {s.operator_address}: cannot listen there")
    server.start()
    return server


def drive(grid: Grid, s: Settings, poll_s: float = 1.0) -> FlowerRelay:
    """The whole run over ``grid``: join, every step, the export; the relay (its coordinator as the run left it,
    the bytes it carried)."""
    store = Store(s.state_dir) if s.state_dir else MemoryStore()
    results = s.results_dir or (str(Path(s.state_dir) / "results") if s.state_dir else "")
    options = Options(results_dir=results, results=bool(results))
    with held(s.state_dir or None), process_settings_kept():
        use_run_threads(s.config)
        coord = Coordinator(s.config, store, options, on_event=log.info)
        if coord.run.state == State.FAILED:
            raise RunRefused(f"state directory {s.state_dir} holds a run that failed: use a fresh one")
        operator = _operator_server(coord, s)
        try:
            relay = FlowerRelay(grid, coord, s)
            if not coord.done.is_set():
                relay.join()
            while not coord.done.is_set():
                if not relay.step():
                    time.sleep(poll_s)  # an open run waiting for the operator's next task (lorm-admin)
            if coord.run.state != State.DONE:
                raise RunRefused(f"the run ended {coord.run.state.value} at task {coord.run.pointer[0]}")
            log.info(
                "run %s done: %d bytes of plans sent, %d bytes of answers received",
                s.config.run_id,
                relay.bytes_sent,
                relay.bytes_received,
            )
        finally:
            if operator is not None:
                operator.stop(grace=1.0)
    return relay


def _log_to_stdout() -> None:
    """The coordinator's events on stdout, which Flower streams to ``flwr run --stream`` and ``flwr log``; Flower's
    own loggers are left as they are."""
    project = logging.getLogger("lorm")
    if not project.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(PlainFormatter())
        project.addHandler(handler)
        project.setLevel(logging.INFO)
        project.propagate = False


def server_app(defaults: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp over the run config, ``defaults`` beneath it (the simulation's Python API passes none)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        _log_to_stdout()
        drive(grid, settings({**(defaults or {}), **context.run_config}))

    return app


app = server_app()
