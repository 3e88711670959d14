"""How fast a client draws its distributed-noise share (issue 44 part 2): ``common/secagg/noise.py``'s Skellam
variates from the ChaCha20 key stream, per entry count and share variance (grid units), against the key stream
alone and numpy's (non-cryptographic) Poisson difference as references. One core; the median of ``--repeats``.

Usage::

    python bench/secagg_noise.py                       # 1e5 and 1e6 entries, four variances
    python bench/secagg_noise.py --counts 1000000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from common.secagg.noise import KeyStream, skellam

VARIANCES = (8.0, 20.0, 2.0**20, 2.0**30, 2.0**41)  # inversion (mean 4), PTRS from its least mean (10) to its largest


def median_seconds(repeats: int, draw: Callable[..., object], *args: object) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        draw(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def stream(count: int) -> np.ndarray:
    return KeyStream().uniforms(count)


def numpy_difference(rng: np.random.Generator, variance: float, count: int) -> np.ndarray:
    return rng.poisson(variance / 2, count) - rng.poisson(variance / 2, count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reference = np.random.default_rng(0)  # the non-cryptographic reference only
    print("| entries | variance (grid units) | skellam s | key stream alone s | numpy poisson diff s (not a CSPRNG) |")
    print("|---|---|---|---|---|")
    for count in args.counts:
        stream_s = median_seconds(args.repeats, stream, 4 * count)  # PTRS takes 2 uniforms a try, twice
        for variance in VARIANCES:
            ours = median_seconds(args.repeats, skellam, variance, count)
            theirs = median_seconds(args.repeats, numpy_difference, reference, variance, count)
            print(f"| {count:,} | {variance:.4g} | {ours:.3f} | {stream_s:.3f} | {theirs:.3f} |")


if __name__ == "__main__":
    main()
