"""What secure aggregation's checks against hostile clients cost the coordinator, at ``K`` clients: the parts
``bench/secagg_cost.py`` does not run (it drives ``ServerSession`` alone, not the coordinator's
``SecureStep``, and its clients are honest).

- advertise, honest: each advertise's keys checked (canonical, no low order: one X25519 exchange per key)
  and compared with the others' (``ServerSession.advertise``), for all ``K`` advertises;
- advertise, signed: as honest, plus each advertise's certificate and signature (``certificate_identity``,
  ``check_signature``: what ``SecureStep`` checks without the run's CA), ECDSA P-256 from a development PKI;
- complaints: one dealer sends garbage to every other client, each of the ``K - 1`` survivors complains
  (revealing that pair's key), and the coordinator judges every complaint (``complaint_verdicts``).

Usage::

    OMP_NUM_THREADS=1 python bench/secagg_checks.py --clients 10 50 100

Prints one row per ``K``: milliseconds in total over the step (the median of ``--repeats``).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

from common.secagg.client_session import ClientSession
from common.secagg.rounds import BOX_BYTES
from common.secagg.server_session import ServerSession
from common.secagg.signed_messages import keys_message
from common.secagg.signing import Signer, Verifier, certificate_identity, check_signature
from server.certs import create_dev_pki

CTX = b"bench|0|0|train"


def timed(work: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def advertise_all(sessions: list[ClientSession], threshold: int, signed: bool) -> None:
    server = ServerSession(expected=list(range(len(sessions))), threshold=threshold, context=CTX)
    for s in sessions:
        k = s.keys
        if signed:
            who = certificate_identity(k.certificate)
            check_signature(
                k.certificate,
                keys_message(CTX, k.index, who, k.cipher_public, k.mask_public, k.commitment),
                k.signature,
            )
        server.advertise(k)


def complaints(clients: int, threshold: int) -> Callable[[], object]:
    """A session through the unmask answers, client ``clients - 1`` having sent garbage to every other client."""
    sessions = [ClientSession(i, threshold, CTX) for i in range(clients)]
    server = ServerSession(expected=list(range(clients)), threshold=threshold, context=CTX, size=1)
    for s in sessions:
        server.advertise(s.keys)
    roster = server.close_keys()
    dealer = clients - 1
    for s in sessions:
        boxes = s.share(roster)
        server.share(s.index, {j: os.urandom(BOX_BYTES) for j in boxes} if s.index == dealer else boxes)
    sharers = server.close_shares()
    for s in sessions:
        server.masked_input(s.index, s.mask(np.zeros((1, 2), dtype=np.uint64), sharers))
    survivors, dropped = server.close_inputs()
    for s in sessions:
        server.reveal(s.index, s.reveal(server.inbox(s.index), survivors, dropped))
    blamed, _ = server.complaint_verdicts()
    assert list(blamed) == [dealer], blamed
    return server.complaint_verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print("| K | advertise honest ms | advertise signed ms | complaints ms (K - 1 judged) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for k in args.clients:
            pki = create_dev_pki(os.path.join(root, str(k)), [f"c{i}" for i in range(k)])
            verifier = Verifier(pki.ca.read_bytes())
            t = k // 2 + 1
            plain = [ClientSession(i, t, CTX) for i in range(k)]
            signers = [Signer.from_files(pki.client_cert(f"c{i}"), pki.client_key(f"c{i}")) for i in range(k)]
            signed = [ClientSession(i, 2 * k // 3 + 1, CTX, signers[i], verifier) for i in range(k)]
            honest_s = timed(functools.partial(advertise_all, plain, t, False), args.repeats)
            signed_s = timed(functools.partial(advertise_all, signed, 2 * k // 3 + 1, True), args.repeats)
            judge = complaints(k, t)
            print(
                f"| {k} | {1e3 * honest_s:.1f} | {1e3 * signed_s:.1f} | {1e3 * timed(judge, args.repeats):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
