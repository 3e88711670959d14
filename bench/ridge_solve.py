"""Peak memory and time of one ridge head's solve, ``W = S (G + lam I)^-1``, at a head block's width.

The closed-form heads' server solves one such system per Gram block and candidate lambda at every task's end
(``server.strategies.closed_form.ridge_head``): 4 blocks x (6 candidates + the head) at ``d = 10,000`` for the best
head (``ridge@mpnet-6layers+valx4avg``), each ``G`` 0.8 GB. This runs one solve in this process, which does nothing
else, and prints the growth of its peak resident set (``ru_maxrss``) over the Gram and the inputs already held, in
``(d, d)`` float64 matrices, and the solve's wall time. ``G`` is ``A + 2 d I``, ``A`` standard normal, made in place
(no second matrix before the baseline): the solve reads its lower triangle, whose symmetric matrix is positive
definite (its off-diagonal part's eigenvalues lie within about ``2 sqrt(d)``), and its memory and flops do not
depend on the entries.

Run it from the checkout whose code it measures (the script puts its own checkout first on the path):

    OMP_NUM_THREADS=1 .venv/bin/python bench/ridge_solve.py [--dim 10000] [--classes 150] [--threads 1]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lab.provenance import code_version  # noqa: E402
from server.strategies.closed_form import ridge_head  # noqa: E402


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def solve_growth(dim: int, classes: int, lam: float) -> tuple[int, float]:
    """One ridge solve at width ``dim`` in this process: the growth of its peak resident set in bytes over the Gram
    and the class sums, and its wall time in seconds."""
    gen = torch.Generator().manual_seed(0)
    gram = torch.randn(dim, dim, generator=gen, dtype=torch.float64)
    gram.diagonal().add_(2.0 * dim)
    sums = torch.randn(classes, dim, generator=gen, dtype=torch.float64)
    ridge_head(gram[:8, :8], sums[:, :8], lam)  # lazy loads (LAPACK, kernels) before the baseline
    before = peak_bytes()
    start = time.perf_counter()
    ridge_head(gram, sums, lam)
    return peak_bytes() - before, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=10_000, help="the Gram block's width d")
    parser.add_argument("--classes", type=int, default=150, help="rows of the class sums S")
    parser.add_argument("--lam", type=float, default=1e5, help="the ridge's lambda")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    d = args.dim
    grown, seconds = solve_growth(d, args.classes, args.lam)
    matrix = d * d * 8
    code = code_version(ROOT)
    where = "?" if code is None else code["commit"][:7] + (" (changed)" if code["changed"] else "")
    print(
        f"ridge solve d={d} C={args.classes} threads={args.threads} code={where}: "
        f"peak grew by {grown / 1e9:.2f} GB = {grown / matrix:.2f} matrices of ({d}, {d}) float64 "
        f"({matrix / 1e9:.2f} GB each) beside the Gram; {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
