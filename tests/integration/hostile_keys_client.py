"""A hostile client of a secure run that attacks the keys and the boxes, as a real process
(tests/integration/test_secagg_hostile_keys.py). As ``hostile_client.py`` it joins with its own certificate,
trains honestly and reports its evaluations honestly; in its secure sessions:

- ``--low-order R``: in training round ``R``'s first session it advertises a low-order mask key (the all-zero
  point, signed as the protocol asks: only the point is wrong) and, refused, sends nothing more;
- ``--garbage-box R``: in training round ``R``'s first session it sends client 0 (on a sparse graph its first
  neighbour) a box of random bytes (the others' boxes honest; in the signed mode under its own signature, as a
  hostile dealer can), then masks its honest update and answers the unmask request honestly;
- ``--bad-deal R``: in training round ``R``'s first session it deals shares of another own-mask seed than the one
  it committed to (and masks with that other seed), then answers honestly: its seed cannot be rebuilt;

and in every other session it drops: keys and shares sent, no masked input. Every wait is bounded.

    PYTHONPATH=<project> python tests/integration/hostile_keys_client.py --server HOST:PORT --client-id ID \\
        --index I --tls-ca CA --tls-cert CERT --tls-key KEY --low-order 0 --garbage-box 1
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable

from hostile_client import Hostile, say

from client.secure import signing
from client.transport import Rejected
from common.aggregation.base import make_aggregator
from common.secagg.blame import sign_box
from common.secagg.client_session import ClientSession
from common.secagg.rounds import BOX_BYTES, Keys
from common.secagg.signed_messages import keys_message
from common.secagg.terms import client_terms, context, fixed_point, masked_update, step_graph
from common.wire.messages import ClientUpdate, RoundPlan


class HostileKeys(Hostile):
    def __init__(self, args: argparse.Namespace) -> None:
        args.wrong_share = args.garbage = -1
        super().__init__(args)
        self.low_order, self.garbage_box, self.bad_deal = args.low_order, args.garbage_box, args.bad_deal

    def secure_step(self, plan: RoundPlan, train: Callable[[], object], key: str) -> None:
        signer, verifier = signing(self.settings, self.security)
        n, ctx = self.config.num_clients, context(plan)
        graph = step_graph(self.settings, n, ctx)  # the complete graph, or the sparse one every party draws alike
        session = ClientSession(self.index, graph.threshold, ctx, signer, verifier, graph=graph)
        what = f"task {plan.task} round {plan.round} attempt {plan.secure_attempt}"
        first = plan.secure_attempt == 0
        if first and plan.round == self.low_order:
            keys = dataclasses.replace(session.advertise(), mask_public=bytes(32))
            if signer is not None:  # a valid signature over the bad key: only the point is wrong
                k = keys
                message = keys_message(ctx, k.index, signer.identity, k.cipher_public, k.mask_public, k.commitment)
                keys = Keys(k.index, k.cipher_public, k.mask_public, k.commitment, k.certificate, signer.sign(message))
            try:
                self.client.secagg(plan, self.index, "advertise", keys=keys)
            except Rejected as err:
                say(f"{what}: low-order key refused ({err.code.name}): {err}")
                return
            say(f"{what}: low-order key taken")
            return
        self.client.secagg(plan, self.index, "advertise", keys=session.advertise())
        roster = self.poll(plan, "roster")["roster"]
        bad_deal = first and plan.round == self.bad_deal
        if bad_deal:
            session.seed = os.urandom(len(session.seed))  # committed to the first seed at advertise
        boxes = session.share(roster)
        if bad_deal:
            self.client.secagg(plan, self.index, "share", shares=boxes)
            say(f"{what}: dealt shares of another seed than committed")
        elif not (first and plan.round == self.garbage_box):
            self.client.secagg(plan, self.index, "share", shares=boxes)
            say(f"{what}: keys and shares sent, dropping out (no masked input)")
            return
        else:
            victim = min(j for j in roster if j != self.index)  # client 0, or on a sparse graph its first neighbour
            boxes[victim] = os.urandom(BOX_BYTES)
            if signer is not None:  # signed by the dealer itself: the coordinator's check passes, the box opens not
                boxes[victim] = sign_box(
                    signer, boxes[victim], self.index, victim, sorted(roster).index(victim) + 1, ctx
                )
            self.client.secagg(plan, self.index, "share", shares=boxes)
            say(f"{what}: sent client {victim} a garbage box")
        inbox = self.poll(plan, "inbox")
        update = train()
        assert isinstance(update, ClientUpdate)
        terms = client_terms(make_aggregator(plan, self.spec, self.config), update)
        fp = fixed_point(self.settings, n)
        self.client.push(masked_update(update, terms, session, inbox["sharers"], fp, plan.secure_attempt), key)
        request = self.poll(plan, "unmask")
        survivors, dropped = request["survivors"], request["dropped"]
        confirmations = None
        if signer is not None:
            self.client.secagg(plan, self.index, "confirm", shares={self.index: session.confirm(survivors, dropped)})
            confirmations = self.poll(plan, "confirmations")["shares"]
        answer = session.reveal(inbox["shares"], survivors, dropped, confirmations)
        self.client.secagg(plan, self.index, "reveal", shares=answer)
        say(f"{what}: masked input and an honest answer sent")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A hostile client of a secure run: bad keys and boxes (tests only).")
    parser.add_argument("--server", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--tls-ca", required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    parser.add_argument("--low-order", type=int, default=-1, help="training round whose first session gets it")
    parser.add_argument("--garbage-box", type=int, default=-1, help="training round whose first session gets it")
    parser.add_argument("--bad-deal", type=int, default=-1, help="training round whose first session gets it")
    parser.add_argument("--limit", type=float, default=420.0, help="seconds the whole run may take")
    args = parser.parse_args(argv)
    hostile = HostileKeys(args)
    try:
        return hostile.run(args.index)
    finally:
        hostile.client.close()


if __name__ == "__main__":
    sys.exit(main())
