"""Print the privacy audit's table (docs/PRIVACY.md, "Audited: empirical lower bounds on epsilon"): for each
mechanism the epsilon the code states and the empirical lower bound its releases show under replace-one adjacency
(``audit_mechanisms.py``), at the slow tests' sizes, or at the default suite's with ``--fast``.

    .venv/bin/python tests/privacy/audit_report.py                   # about a minute of one core
    .venv/bin/python tests/privacy/audit_report.py --fast            # about 10 seconds
    .venv/bin/python tests/privacy/audit_report.py --only dpsgd      # one row
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from audit_mechanisms import (  # noqa: E402
    FAST_EPSILON,
    LORM_BUDGET,
    SLOW_EPSILON,
    Audit,
    central,
    central_counts,
    client_level,
    distributed,
    dpsgd,
    lorm_grams,
)

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Row:
    key: str  # its name for --only
    mechanism: str
    neighbours: str
    run: Callable[[float, int], Audit]
    epsilon: float  # stated at the slow size (--fast: FAST_EPSILON)
    samples: int  # a side, at the slow size
    fast: int  # a side, at the default suite's size
    fast_epsilon: float = FAST_EPSILON


def ncm(epsilon: float, samples: int) -> Audit:
    return central("ncm", epsilon, samples)


def ridge(epsilon: float, samples: int) -> Audit:
    return central("ridge", epsilon, samples)


def ridge_gram(epsilon: float, samples: int) -> Audit:
    return central("ridge", epsilon, samples, orthogonal=True)


def count(epsilon: float, samples: int) -> Audit:
    return central_counts(samples, remove=True)


NEGATED = "x → −x"
ROWS = (
    Row("ncm", "central ncm (class sums)", NEGATED, ncm, SLOW_EPSILON, 10**7, 500_000),
    Row("ridge", "central ridge (Gram + class sums)", NEGATED, ridge, SLOW_EPSILON, 10**7, 500_000),
    Row("ridge-gram", "central ridge, the Gram's part", "x → x′ ⊥ x", ridge_gram, FAST_EPSILON, 10**7, 500_000),
    Row("distributed", "distributed ncm (2 of 3 clients' shares)", NEGATED, distributed, SLOW_EPSILON, 10**6, 150_000),
    Row("dpsgd", "DP-SGD, one step at q = 1", NEGATED, dpsgd, SLOW_EPSILON, 10**7, 500_000),
    Row("lorm-gram", "LoRM's Gram release", "x → x′ ⊥ x", lorm_grams, LORM_BUDGET, 10**7, 500_000, LORM_BUDGET),
    Row(
        "client-level", "client level, one round", "a client's change → −it", client_level, SLOW_EPSILON, 10**7, 500_000
    ),
    Row(
        "count",
        "class count under add/remove (not the stated adjacency)",
        "x removed",
        count,
        FAST_EPSILON,
        10**6,
        10**6,
    ),
)


def code_version() -> str:
    """The commit, marked when the mechanisms' code differs from it."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--", "common", "server", "client"], cwd=ROOT, capture_output=True, text=True
    ).stdout
    if not commit.strip():
        return "—"  # not a git checkout (an exported tree)
    return f"`{commit.strip()}`" + (" + uncommitted changes" if changed.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="the default suite's sizes, at epsilon 2")
    parser.add_argument("--only", action="append", choices=[row.key for row in ROWS], help="this row only (repeatable)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    version = code_version()
    print("| mechanism | neighbours | stated ε | lower bound ε | releases a side | confidence | s | code | command |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in ROWS:
        if args.only and row.key not in args.only:
            continue
        epsilon, samples = (row.fast_epsilon, row.fast) if args.fast else (row.epsilon, row.samples)
        start = time.perf_counter()
        audit = row.run(epsilon, samples)
        seconds = time.perf_counter() - start
        refuted = " **(refuted)**" if audit.bound.epsilon >= audit.stated else ""
        command = f"`tests/privacy/audit_report.py {'--fast ' if args.fast else ''}--only {row.key}`"
        print(
            f"| {row.mechanism} | {row.neighbours} | {audit.stated:.2f} | {audit.bound.epsilon:.2f}{refuted} | "
            f"{samples:,} | {100 * audit.bound.confidence:g} % | {seconds:.0f} | {version} | {command} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
