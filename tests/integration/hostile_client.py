"""A hostile client of a secure run, as a real process (tests/integration/test_secagg_hostile_run.py).

It joins with its own certificate and index, trains its shard honestly, and takes part in every secure
session's keys and shares as the protocol asks (signed, in the signed mode), then deviates in the first
session (attempt 0) of two training rounds:

- ``--wrong-share R``: an honest masked input, then an answer to the unmask request with every share's
  bytes flipped;
- ``--garbage R``: random int64 ring limbs in the step's layout (that of its own honest masked input)
  instead of its masked input; its answer is honest;

and in every other session it drops: keys and shares sent, no masked input (the others' shares remove
its masks). Evaluations are reported honestly. Every wait is bounded in time (``--limit``) and count.

    PYTHONPATH=<project> python tests/integration/hostile_client.py --server HOST:PORT --client-id ID --index I \\
        --tls-ca CA --tls-cert CERT --tls-key KEY --wrong-share 0 --garbage 1
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from collections.abc import Callable

import torch

from client.runtime import build_runtime
from client.secure import signing
from client.transport import Backoff, CoordinatorClient, Rejected
from common.aggregation.base import make_aggregator
from common.infra.tls import Security
from common.run.settings import SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.terms import client_terms, context, fixed_point, masked_update, step_graph
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, Phase, RoundPlan, Wait

MAX_CALLS = 2000  # polls of one stage, and pulls of the whole run, at most


def say(text: str) -> None:
    print(f"hostile: {text}", flush=True)


class Hostile:
    """Client ``index`` of the run, deviating as ``wrong_share`` and ``garbage`` (training rounds) say."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.security = Security(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key).check("client")
        # Retrying as long as the test's honest clients do (--give-up 120): the test kills the coordinator and
        # starts it again, which takes half a minute on a loaded machine.
        self.client = CoordinatorClient(
            args.server, args.client_id, Backoff(give_up_s=120), call_timeout_s=30, security=self.security
        )
        self.wrong_share, self.garbage = args.wrong_share, args.garbage
        self.end = time.monotonic() + args.limit

    def left(self) -> bool:
        return time.monotonic() < self.end

    def poll(self, plan: RoundPlan, stage: str) -> dict:
        """Ask ``stage`` until the coordinator has fixed it, within the time limit."""
        for _ in range(MAX_CALLS):
            reply = self.client.secagg(plan, self.index, stage)
            if reply["ready"] or not self.left():
                break
            time.sleep(max(reply["retry_after_s"], 0.05))
        if not reply["ready"]:
            raise TimeoutError(f"stage {stage} was never ready")
        return reply

    def run(self, index: int) -> int:
        self.config, self.index = self.client.join(index)
        runtime = build_runtime(self.config)
        worker = runtime.worker(self.index, self.client.client_id)
        self.client.describe(runtime.spec)
        self.spec: ModelSpec = runtime.spec
        self.settings = self.config.section(SecAggSettings)
        say(f"joined run {self.config.run_id} as client {self.index}")
        acted: set[tuple] = set()  # the sessions (step, attempt) it has taken part in: once each
        for _ in range(MAX_CALLS):
            if not self.left():
                break
            answer = self.client.pull()
            if isinstance(answer, Wait):
                time.sleep(answer.retry_after_s)
                continue
            plan = answer
            if plan.phase == Phase.DONE:
                say("the run is over")
                return 0
            where = (plan.task, plan.round, plan.phase.value, plan.secure_attempt)
            if where in acted:
                time.sleep(0.2)  # dropped out of this session: wait for the next
                continue
            acted.add(where)
            key = f"{self.config.run_id}/{plan.task}/{plan.round}/{plan.phase.value}/{self.index}"
            try:
                if plan.phase == Phase.EVALUATE:
                    report = worker.handle(plan)
                    assert isinstance(report, EvalReport)
                    self.client.report(report, key)
                    say(f"task {plan.task} evaluated honestly")
                    continue
                self.secure_step(plan, functools.partial(worker.handle, plan), key)
            except Rejected as err:  # ABORTED: the session restarted; FAILED_PRECONDITION: it went on without us
                say(f"task {plan.task} round {plan.round} attempt {plan.secure_attempt}: {err}")
        say("gave up: the run did not end within the time limit")
        return 1

    def secure_step(self, plan: RoundPlan, train: Callable[[], object], key: str) -> None:
        n = self.config.num_clients
        signer, verifier = signing(self.settings, self.security)
        ctx = context(plan)
        graph = step_graph(self.settings, n, ctx)  # the complete graph, or the sparse one every party draws alike
        session = ClientSession(self.index, graph.threshold, ctx, signer, verifier, graph=graph)
        what = f"task {plan.task} round {plan.round} attempt {plan.secure_attempt}"
        self.client.secagg(plan, self.index, "advertise", keys=session.advertise())
        roster = self.poll(plan, "roster")["roster"]
        self.client.secagg(plan, self.index, "share", shares=session.share(roster))
        first = plan.secure_attempt == 0
        deviate = "wrong shares" if first and plan.round == self.wrong_share else ""
        deviate = "garbage input" if first and plan.round == self.garbage else deviate
        if not deviate:
            say(f"{what}: keys and shares sent, dropping out (no masked input)")
            return
        inbox = self.poll(plan, "inbox")
        update = train()
        assert isinstance(update, ClientUpdate)
        terms = client_terms(make_aggregator(plan, self.spec, self.config), update)  # as client/secure.py does
        fp = fixed_point(self.settings, n)
        pushed = masked_update(update, terms, session, inbox["sharers"], fp, plan.secure_attempt)
        if deviate == "garbage input":  # the honest input's layout, random ring limbs in it
            g = torch.Generator().manual_seed(41)
            noise = {
                name: torch.randint(-(2**63), 2**63 - 1, tuple(t.shape), generator=g, dtype=torch.int64)
                for name, t in pushed.tensors.items()
            }
            pushed = dataclasses.replace(pushed, tensors=noise)
        self.client.push(pushed, key)
        request = self.poll(plan, "unmask")
        survivors, dropped = request["survivors"], request["dropped"]
        confirmations = None
        if session.signer is not None:
            signature = session.confirm(survivors, dropped)
            self.client.secagg(plan, self.index, "confirm", shares={self.index: signature})
            confirmations = self.poll(plan, "confirmations")["shares"]
        answer = session.reveal(inbox["shares"], survivors, dropped, confirmations)
        if deviate == "wrong shares":
            answer = {j: bytes(b ^ 0x5A for b in s) for j, s in answer.items()}
            # Said before the call: the answer that completes the session's reveals is the coordinator's last
            # call of that session, which a test may kill the coordinator inside (its retry is ABORTED).
            say(f"{what}: revealing wrong shares")
        self.client.secagg(plan, self.index, "reveal", shares=answer)
        say(f"{what}: sent {deviate}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A hostile client of a secure run (tests only).")
    parser.add_argument("--server", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--tls-ca", required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument(
        "--wrong-share", type=int, default=-1, help="training round whose first session gets wrong shares"
    )
    parser.add_argument(
        "--garbage", type=int, default=-1, help="training round whose first session gets a garbage input"
    )
    parser.add_argument("--limit", type=float, default=420.0, help="seconds the whole run may take")
    args = parser.parse_args(argv)
    hostile = Hostile(args)
    try:
        return hostile.run(args.index)
    finally:
        hostile.client.close()


if __name__ == "__main__":
    sys.exit(main())
