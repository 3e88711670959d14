"""The Flower ClientApp: one site's :class:`~client.session.ClientSession`, its steps carried by Flower messages.

A SuperNode's ``--node-config`` holds the site's own decisions, as ``lorm-client``'s flags without their dashes
(``data=PATH test-data=PATH privacy-ledger=FILE min-clients=3 ...``; the simulation engine's ``partition-id`` is the
slot asked for, as ``index``). The client's identity is Flower's: the node id the SuperLink authenticated.

Each message is one call of the session: ``query.hello`` asks which slot the site wants, ``query.join`` hands it
the run as a Join reply would (the session refuses it by its own floor, caps and local settings, builds the model
on its own data, opens its ledger, and answers its model's description), and each step's message carries a plan
that :meth:`ClientSession.step` answers with the update or evaluation report it would push. A refusal raises, and
the ServerApp fails the run naming it. The session (the loaded backbone and data) is kept for the next message
while the process lives: across a simulation's messages, and, on the deployment engine, which starts a process per
message, rebuilt from the message's run record (the worker keeps nothing between steps but its data, so the update
is the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client.arguments import client_parser, options_from_args
from client.local import LocalSettings
from client.runtime import ClientRuntime, build_runtime
from client.session import ClientOptions, ClientSession, Exit
from common.infra.tls import Security
from common.run.config import RunConfig
from common.run.schedule import Schedule
from common.run.settings import DataSettings
from common.secagg.rounds import Keys
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, RoundPlan, Wait
from flower import records

app = ClientApp()


class Refusal(RuntimeError):
    """This site will not take (or cannot go on with) the run: Flower carries the reason to the ServerApp."""


class MessageTransport:
    """The session's calls of its coordinator, answered by the message in hand: Join by its run record, what the
    session pushes or reports kept as the reply. No secure aggregation: its rounds are calls within a step, and a
    ServerApp refuses such a run at start."""

    def __init__(self) -> None:
        self.run: Any = None  # the run record of the message in hand
        self.schedule: Schedule | None = None
        self.reply: RecordDict | None = None

    def join(self, requested_index: int | None = None) -> tuple[RunConfig, int]:
        config, self.schedule, index = records.run_from_record(self.run)
        return config, index

    def describe(self, spec: ModelSpec) -> None:
        self.reply = records.spec_content(spec)

    def pull(self) -> RoundPlan | Wait:
        raise Refusal("a Flower client is handed its plans, it does not pull them")

    def push(self, update: ClientUpdate, key: str) -> bool:
        self.reply = records.update_content(update, key)
        return False

    def report(self, report: EvalReport, key: str) -> bool:
        self.reply = records.report_content(report, key)
        return False

    def secagg(self, plan: RoundPlan, index: int, stage: str, keys: Keys | None = None, shares: Any = None) -> dict:
        raise Refusal("secure aggregation runs on the native coordinator (lorm-server), not over Flower messages")

    def pause(self, seconds: float) -> None:
        """Nothing to wait for: the next message is the next call."""

    def close(self) -> None:
        """Nothing to close: Flower holds the connection."""


_RUNTIMES: dict[str, ClientRuntime] = {}  # a common dataset's runtime, shared by the virtual nodes of one process


class FlowerSession(ClientSession):
    """A site's session over Flower messages. Virtual nodes of one simulation process that read shards of one
    common dataset share its runtime (the model and dataset), as the in-process engine's clients do; a site's own
    data is its own."""

    transport: MessageTransport
    virtual = False  # a node of the simulation engine: the run's configuration is its own party's, as lorm-sim's

    def _refuse_coordinator_local(self, config: RunConfig) -> None:
        if not self.virtual:
            super()._refuse_coordinator_local(config)

    def _runtime(self, config: RunConfig) -> ClientRuntime:
        if config.section(DataSettings).owned:
            return super()._runtime(config)
        key = config.to_json()
        if key not in _RUNTIMES:
            _RUNTIMES.clear()  # another run's: not kept beside this one's
            _RUNTIMES[key] = build_runtime(config)
        return _RUNTIMES[key]


_SESSIONS: dict[tuple[int, str], FlowerSession] = {}  # (node, run id) -> its session in this process


def node_argv(node_config: Mapping[str, Any], parser: argparse.ArgumentParser) -> list[str]:
    """``lorm-client``'s command line of a node's configuration: ``key=value`` is ``--key value``, a switch
    ``key=true``; the simulation's ``partition-id`` is ``--index`` (``ValueError`` for a key that is no flag)."""
    argv = ["--server", "flower"]
    flags = parser._option_string_actions  # noqa: SLF001 (argparse's table of flags: which take no value)
    for key, value in node_config.items():
        if key == "num-partitions":
            continue
        flag = "--index" if key == "partition-id" else f"--{key}"
        action = flags.get(flag)
        if action is None or flag in ("--server", "--client-id"):
            raise ValueError(f"node-config {key}: not a setting of a site (lorm-client --help lists them)")
        if action.nargs == 0:
            if str(value).lower() in ("true", "1", "yes"):
                argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def virtual(context: Context) -> bool:
    """A node of Flower's simulation engine (its node configuration is the engine's ``partition-id`` and
    ``num-partitions``): one party with the ServerApp, whose configuration names its data (``data.clients_dir``,
    ``data_dir``), as the in-process engine's clients are."""
    return "num-partitions" in context.node_config


def site_options(context: Context) -> ClientOptions:
    """The site's own decisions, from its node configuration; its identity the node's."""
    parser = client_parser()
    args = parser.parse_args(node_argv(context.node_config, parser))
    options = options_from_args(args, Security(insecure=True))
    return dataclasses.replace(options, client_id=records.client_id(context.node_id), interactive=False)


def _session(msg: Message, context: Context) -> FlowerSession:
    """The node's session for the run in ``msg``, set up anew when this process has none. A session whose run
    keeps a privacy ledger is never kept: the simulation engine may hand a node's next message to another of its
    processes, and the account of what the node released must be the one on disk, not a stale copy."""
    run = msg.content.config_records[records.RUN]
    config, _, index = records.run_from_record(run)
    key = (context.node_id, config.run_id)
    session = _SESSIONS.get(key)
    if session is None:
        options = site_options(context)
        if virtual(context):  # its own data in the run's folder of every client's, as lorm-sim's clients
            clients_dir = config.section(DataSettings).clients_dir
            local = LocalSettings(clients_dir=clients_dir).for_client(index) if clients_dir else options.local
            # and its ledger, as theirs, in the run's scratch: one simulation's (Flower's run id), every process's
            ledger = options.privacy_ledger or scratch_ledger(context.run_id, index)
            options = dataclasses.replace(options, local=local, privacy_ledger=ledger)
        session = FlowerSession(MessageTransport(), options)
        session.virtual = virtual(context)
        session.transport.run = run
        try:
            session.setup()
        except Exit as refused:
            raise Refusal(f"{records.client_id(context.node_id)} refuses the run: {refused}") from refused
        for other in [k for k in _SESSIONS if k[1] != key[1]]:
            del _SESSIONS[other]  # one run at a time in a process: another run's sessions are not kept
        if session.ledger is None:
            _SESSIONS[key] = session  # the virtual nodes of one simulation process: each its own
    session.transport.run = run
    return session


def scratch_ledger(flower_run: int, index: int) -> Path:
    """A virtual node's privacy ledger: in the simulation's own folder of the system's temporary directory, shared
    by the simulation's processes, fresh for each simulation, as ``lorm-sim`` keeps its clients' for a run."""
    return Path(tempfile.gettempdir()) / f"lorm-flower-{flower_run}" / f"client-{index}.json"


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """The slot this site asks for (-1: any)."""
    options = site_options(context)
    index = -1 if options.index is None else options.index
    return Message(RecordDict({records.WIRE: ConfigRecord({"index": index})}), reply_to=msg)


@app.query("join")
def join(msg: Message, context: Context) -> Message:
    """Set up for the run as a Join reply states it; answer the model's description."""
    session = _session(msg, context)
    return Message(records.spec_content(session.runtime.spec), reply_to=msg)


def _step(msg: Message, context: Context) -> Message:
    session = _session(msg, context)
    plan = records.plan_from_content(msg.content)
    session.transport.reply = None
    try:
        session.step(plan)
    except Exit as refused:
        raise Refusal(f"{records.client_id(context.node_id)} refuses the run: {refused}") from refused
    if session.transport.reply is None:
        raise Refusal(f"{records.client_id(context.node_id)} answered nothing to task {plan.task} round {plan.round}")
    return Message(session.transport.reply, reply_to=msg)


# each step's phase is one action: the same session answers them all
app.train("lorm")(_step)
app.query("task_gram")(_step)
app.query("features")(_step)
app.evaluate("lorm")(_step)
