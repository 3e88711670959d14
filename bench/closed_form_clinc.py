"""Closed-form heads on frozen all-MiniLM-L6-v2 features, CLINC150, with the in-process engine.

Methods (one run each, full train and test sets, 10 clients, 5 tasks of 30 intents, Dirichlet
beta 0.5, max length 64):
  ncm       cosine nearest class mean                        (issue, measured outside: 91.7 %)
  ridge     ridge head on the 384-d features                 (issue: 91.1 %)
  ridge-rp  random projection to 5,000 dims + ReLU, ridge    (issue, lambda 10: 95.1 %)
  lorm-ridge-first  LoRM adapts the backbone on task 0 only (5 rounds of 1 epoch, rank 1,
            lr 1e-2), then ridge-rp on W0 + B^0 A^0 for every task   (issue: 95.5 %)
  lorm-ridge  LoRM on every task, ridge-rp under the merged backbone (sums mix views)
  lorm-ncm  as lorm-ridge with the cosine NCM head on the 384-d features
The lorm-* methods train LoRA, so unlike the others their result depends on beta.
Ridge chooses lambda on held-out training samples (every 5th by global index), never test data.

For each: FAA as the paper defines it (mean over tasks of the final accuracies), FAA as the
reference code computes it (over all test samples seen), which after the last task is the
accuracy over all 150 classes, the lambda chosen after each task, and the wall time.

Run: .venv/bin/python bench/closed_form_clinc.py [--methods ncm ridge ridge-rp lorm-ridge-first ...] [--beta 0.5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine.simulation as simulation  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.wire.messages import ModelSpec  # noqa: E402
from server.strategies import make_strategy  # noqa: E402
from server.strategies.base import Strategy  # noqa: E402

LORM: dict[str, Any] = {"rounds_per_task": 5, "local_epochs": 1, "rank": 1, "lr": 1e-2}  # the issue's LoRM settings
# name -> (strategy, extra settings, the issue's figure (nan: none), other RunConfig fields)
METHODS: dict[str, tuple[str, dict[str, Any], float, dict[str, Any]]] = {
    "ncm": ("ncm", {}, 91.7, {}),
    "ridge": ("ridge", {}, 91.1, {}),
    "ridge-rp": ("ridge", {"rp_dim": 5000}, 95.1, {}),
    "lorm-ridge-first": ("lorm-ridge-first", {"rp_dim": 5000}, 95.5, LORM),
    "lorm-ridge": ("lorm-ridge", {"rp_dim": 5000}, float("nan"), LORM),
    "lorm-ncm": ("lorm-ncm", {}, float("nan"), LORM),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=["ncm", "ridge", "ridge-rp"])
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("LORM_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "datasets")),
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    made: list[Strategy] = []  # the strategy of each run, to read the lambda it chose

    def make_and_keep(config: RunConfig, spec: ModelSpec) -> Strategy:
        made.append(make_strategy(config, spec))
        return made[-1]

    simulation.make_strategy = make_and_keep
    rows = []
    for name in args.methods:
        strategy, extra, issue, fields = METHODS[name]
        config = RunConfig(
            run_id=f"closed-form-{name}",
            method=strategy,
            dataset="clinc150",
            data_dir=args.data_dir,
            backbone="minilm",
            max_length=64,
            num_tasks=5,
            num_clients=10,
            beta=args.beta,
            threads=args.threads,
            extra=extra,
            **fields,
        )
        lambdas: list[float | None] = []

        def log(line: str, name: str = name, lambdas: list[float | None] = lambdas) -> None:
            print(f"  [{name}] {line}", flush=True)
            if "evaluated" in line:  # the head just evaluated was solved with this lambda
                head = getattr(made[-1], "closed", made[-1])  # lorm-*: the closed-form head inside
                lambdas.append(getattr(head, "lam", None))

        start = time.perf_counter()
        result = simulation.run_inprocess(config, log=log)
        seconds = time.perf_counter() - start
        m = result.matrix
        final_all = 100.0 * sum(m.correct[-1]) / sum(m.total[-1])
        shown = "-" if issue != issue else f"{issue:.1f}"  # nan: the issue gives no figure
        rows.append((name, m.faa(), m.faa_weighted(), final_all, shown, lambdas, seconds, sum(m.total[-1])))
        print(
            f"{name}: FAA {m.faa():.2f} / weighted {m.faa_weighted():.2f}, all classes {final_all:.2f} "
            f"(issue {shown}), lambda {lambdas}, {seconds:.0f} s",
            flush=True,
        )

    print(f"\nCLINC150, all-MiniLM-L6-v2 frozen, 10 clients, 5 tasks, beta {args.beta}, max length 64")
    print(
        f"{'method':<18}{'FAA paper':>11}{'FAA weighted':>14}{'all 150':>9}{'issue':>7}{'test n':>8}"
        f"{'seconds':>9}  lambda per task"
    )
    for name, faa, weighted, final_all, shown, lambdas, seconds, n in rows:
        lam = " ".join("-" if v is None else f"{v:g}" for v in lambdas)
        print(f"{name:<18}{faa:>11.2f}{weighted:>14.2f}{final_all:>9.2f}{shown:>7}{n:>8}{seconds:>9.0f}  {lam}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
