"""Every round of a step's secure aggregation among in-process parties, without a coordinator (the tests' and the
cost bench's harness; a run's secure steps go through ``server.secure.step.SecureStep``):
the same sessions as over the wire, called directly, each party's seconds timed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from common.aggregation.base import Aggregator, make_aggregator
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.primitives import decode
from common.secagg.server_session import ServerSession
from common.secagg.terms import Layout, client_terms, context, encode_terms, pack, run_encoding, step_graph, unpack
from common.wire.messages import ClientUpdate, ModelSpec
from server.secure.sums import load_sums


@dataclass
class Timings:
    """Seconds each party spent in :func:`secure_step`: each client computing its terms, sharing,
    masking and answering; the coordinator adding the masked inputs and unmasking (bench/secagg_cost.py)."""

    client: dict[int, float] = field(default_factory=dict)
    server: float = 0.0

    @contextlib.contextmanager
    def of(self, party: int | None) -> Iterator[None]:
        """Time the block for client ``party`` (``None``: the coordinator)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            if party is None:
                self.server += seconds
            else:
                self.client[party] = self.client.get(party, 0.0) + seconds


def secure_step(
    aggregator: Aggregator,
    spec: ModelSpec,
    config: RunConfig,
    updates: dict[int, ClientUpdate],
    settings: SecAggSettings,
    clients: int,
    drop_after_sharing: tuple[int, ...] = (),
    timings: Timings | None = None,
) -> ServerSession:
    """One step's secure aggregation among in-process clients: every round of the protocol, with the
    clients ``drop_after_sharing`` vanishing after the share round (their masks are removed from the
    sum). Each client folds its update into a fresh aggregator of the step, built as a client builds it
    (``common.aggregation.base.make_aggregator`` of the plan, the model ``spec`` and the run's ``config``).
    Loads the survivors' sum into ``aggregator``; returns the coordinator's session (what it held).
    ``timings``: the parties' seconds are added to it."""
    clock = timings or Timings()
    plan = aggregator.plan
    ctx = context(plan)
    graph = step_graph(settings, clients, ctx)
    t = graph.threshold
    fp, noise = run_encoding(settings, config.section(DpSettings), clients)
    terms, sessions = {}, {}
    for i, u in sorted(updates.items()):
        with clock.of(i):
            terms[i] = pack(client_terms(make_aggregator(plan, spec, config), u))
            sessions[i] = ClientSession(i, t, ctx, graph=graph)
    layout = Layout.of(next(iter(terms.values())))
    server = ServerSession(expected=list(range(clients)), threshold=t, context=ctx, size=layout.size, graph=graph)
    for s in sessions.values():
        server.advertise(s.advertise())
    server.close_keys()
    for i, s in sessions.items():
        with clock.of(i):
            boxes = s.share(server.roster_for(i))
        server.share(i, boxes)
    sharers = server.close_shares()
    for i, s in sessions.items():
        if i not in drop_after_sharing:
            with clock.of(i):
                y = s.mask(encode_terms(terms[i], fp, s, noise, plan.class_range), sharers)
            with clock.of(None):
                server.masked_input(i, y)
    survivors, dropped = server.close_inputs()
    for i in survivors:
        inbox = server.inbox(i)
        with clock.of(i):
            answer = sessions[i].reveal(inbox, survivors, dropped)
        server.reveal(i, answer)
    with clock.of(None):
        total = decode(server.result(), fp, len(survivors))
        payload = 16 * layout.size * len(survivors)
        slack = noise.gram_slack(layout.entries, len(survivors)) if noise is not None else 0.0
        load_sums(
            aggregator,
            unpack(layout.unflatten(total)),
            len(survivors),
            payload,
            slack,
            fp.error_bound(len(survivors)),
            noise is not None,
        )
    return server
