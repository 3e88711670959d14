"""``lorm-client``: one client process. It dials out, trains on its own shard, and pushes."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from client.runtime import build_runtime
from client.transport import Backoff, CoordinatorClient, Rejected
from common import serde
from common.messages import ClientUpdate, Phase, RoundPlan


def idempotency_key(run_id: str, plan: RoundPlan, client_index: int) -> str:
    """One key per client and step: a retried or recomputed push of the same step has the same key."""
    return f"{run_id}/{plan.task}/{plan.round}/{plan.phase.value}/{client_index}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lorm-client", description="Run one LoRM client.")
    parser.add_argument("--server", required=True, help="coordinator address, host:port")
    parser.add_argument("--client-id", required=True, help="this client's stable identity (reuse it on restart)")
    parser.add_argument("--index", type=int, default=None, help="ask for this data shard (0..N-1)")
    parser.add_argument("--give-up", type=float, default=600.0, help="seconds one call retries before failing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {args.client_id} %(message)s", stream=sys.stdout)
    log = logging.getLogger("lorm.client")

    client = CoordinatorClient(args.server, args.client_id, Backoff(give_up_s=args.give_up))
    config, index = client.join(args.index)
    log.info("joined run %s as client %d of %d", config.run_id, index, config.num_clients)
    runtime = build_runtime(config)
    worker = runtime.worker(index, args.client_id)
    client.describe(runtime.spec)
    log.info("model: %d LoRA layers, device %s; shard sizes per task %s", len(runtime.spec.layers),
             runtime.device, [int(s.numel()) for s in worker.shards])
    while True:
        answer = client.pull()
        if isinstance(answer, serde.Wait):
            time.sleep(answer.retry_after_s)
            continue
        plan = answer
        if plan.phase == Phase.DONE:
            log.info("run %s is over", config.run_id)
            client.close()
            return 0
        start = time.perf_counter()
        result = worker.handle(plan)
        key = idempotency_key(config.run_id, plan, index)
        try:
            if isinstance(result, ClientUpdate):
                client.push(result, key)
                log.info("task %d round %d %s %s: %d samples, loss %.4f, %.1f s", plan.task, plan.round,
                         plan.phase.value, "".join(plan.train_factors) or "-", result.num_samples,
                         result.train_loss, time.perf_counter() - start)
            else:
                client.report(result, key)
                acc = [100.0 * c / t if t else float("nan") for c, t in zip(result.correct, result.total)]
                log.info("task %d evaluated on my test share: %s", plan.task, " ".join(f"{a:.1f}" for a in acc))
        except Rejected as err:
            # A stale step (closed at its deadline without us): drop it and pull the next one.
            if err.code.name != "FAILED_PRECONDITION":
                raise
            log.info("update refused (%s); moving on", err)


if __name__ == "__main__":
    sys.exit(main())
