"""``lorm-client --sessions N``: one process hosting N clients, each a whole session over its own gRPC channel.

For a federation larger than its machines (a load test, a simulation of a thousand sites on a few hosts): hosted
client ``j`` (``0 .. N - 1``) asks for index ``--index + j`` under the client id ``<--client-id>-<index>``, and
``{client_id}`` in ``--tls-cert``, ``--tls-key``, ``--token-file`` and ``--privacy-ledger`` is replaced by that id,
so that each client holds its own certificate, token and ledger as a client of its own process would. Each runs
in a thread of its own (:class:`~client.session.ClientSession`, nothing shared but the process: the model and the
data are built per client unless they share a run without data of their own); the process exits 0 when every
client did, else with the first other exit code.

The hosted clients compute one at a time (:class:`HostedSession`): building a model and computing a step seed
and draw from torch's global generator, which threads share, so two at once would make each other's results
depend on timing (measured: a ridge head of 19 % instead of 97 % when forty clients built their tiny models at
once). Their secure rounds, waits and transfers overlap freely. Clients of the same run without data of their own
(a synthetic dataset, or the run's dataset by shard) share one runtime, as the in-process engine's do; one with
``--data`` builds its own.

The clients share the process's log context (``common.infra.logs``): a line names the client it comes from in its
message where it matters (its index), not in its context fields.
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Callable

from client.runtime import ClientRuntime
from client.session import ClientOptions, ClientSession
from client.telemetry import ClientMetrics
from client.transport import Backoff, CoordinatorClient, Transport
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, EvalReport, RoundPlan

log = logging.getLogger("lorm.client")

PLACEHOLDER = "{client_id}"
OWN_FILES = {
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "token_file": "--token-file",
    "privacy_ledger": "--privacy-ledger",
}


def hosted_id(client_id: str, index: int) -> str:
    return f"{client_id}-{index}"


def hosted_args(args: argparse.Namespace, j: int) -> argparse.Namespace:
    """Hosted client ``j``'s flags: its index and id, and its own files where the flags name them by id.
    ``ValueError`` when a file would be every hosted client's, or there is no first index to count from."""
    if args.index is None:
        raise ValueError("--sessions needs --index: the first hosted client's index (the others follow it)")
    index = args.index + j
    client_id = hosted_id(args.client_id, index)
    mine = argparse.Namespace(**vars(args))
    mine.index, mine.client_id, mine.sessions, mine.no_progress = index, client_id, 1, True
    for name, flag in OWN_FILES.items():
        path = getattr(args, name, None)
        if path and PLACEHOLDER not in str(path):
            raise ValueError(
                f"--sessions {args.sessions}: {flag} {path} would be every hosted client's; name each client's own "
                f"with {PLACEHOLDER} in the path"
            )
        if path:
            setattr(mine, name, type(path)(str(path).replace(PLACEHOLDER, client_id)))
    return mine


class Host:
    """What a process's hosted clients share: the lock they compute under, and runtimes by accepted run."""

    def __init__(self) -> None:
        self.computing = threading.Lock()
        self.runtimes: dict[str, ClientRuntime] = {}


class HostedSession(ClientSession):
    """A hosted client's session: its model built and its steps computed under the host's lock; a runtime shared
    with the host's other clients of the same run when it has no data of its own."""

    def __init__(
        self,
        transport: Transport,
        options: ClientOptions,
        metrics: ClientMetrics,
        backoff: Backoff,
        host: Host,
    ) -> None:
        super().__init__(transport, options, metrics, backoff)
        self.host = host

    def setup(self) -> None:
        with self.host.computing:
            super().setup()

    def _runtime(self, config: RunConfig) -> ClientRuntime:
        if self.options.local.own() is not None:
            return super()._runtime(config)
        key = config.to_json()
        if key not in self.host.runtimes:
            self.host.runtimes[key] = super()._runtime(config)
        return self.host.runtimes[key]

    def _compute(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        with self.host.computing:
            return super()._compute(plan)


def run_hosted(args: argparse.Namespace, options: Callable[[argparse.Namespace], ClientOptions]) -> int:
    """Run ``args.sessions`` hosted clients to the end of the run (``options``: a client's options from its flags;
    every client's are checked before any starts); the process's exit code."""
    mine = [hosted_args(args, j) for j in range(args.sessions)]
    checked = [options(a) for a in mine]
    codes: dict[int, int] = {}
    host = Host()

    def one(j: int) -> None:
        a, o = mine[j], checked[j]
        backoff = Backoff(give_up_s=a.give_up)
        transport = CoordinatorClient(a.server, o.client_id, backoff, a.call_timeout, security=o.security)
        try:
            codes[j] = HostedSession(transport, o, ClientMetrics(), backoff, host).run()
        except Exception:  # one client's failure is its own: the others go on, and the process says so
            log.exception("hosted client %s failed", o.client_id)
            codes[j] = 1

    threads = [threading.Thread(target=one, args=(j,), name=f"client-{j}", daemon=True) for j in range(len(mine))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = {mine[j].index: c for j, c in sorted(codes.items()) if c}
    if failed:
        log.error("hosted clients ended with codes %s", failed)
    return next(iter(failed.values()), 0)
