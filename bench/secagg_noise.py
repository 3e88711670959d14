"""How fast a client draws its distributed-noise share: ``common/secagg/discrete_gaussian.py``'s exact discrete
Gaussian from the ChaCha20 key stream, per entry count and share variance (grid units), against the key stream alone
(the same number of words) and numpy's rounded normal (neither exact nor cryptographic) as references. One core; the
median of ``--repeats``; the words per entry the sampler drew.

Usage::

    python bench/secagg_noise.py                       # 1e5 and 1e6 entries, five variances
    python bench/secagg_noise.py --counts 1000000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from common.secagg.discrete_gaussian import KeyStream, discrete_gaussian

VARIANCES = (1, 2**20, 2**30, 2**38, 2**40)  # the least, two middling, a distributed-DP share's, the grid's cap


def median_seconds(repeats: int, draw: Callable[..., object], *args: object) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        draw(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def words_per_entry(variance: int, count: int) -> float:
    stream = KeyStream()
    discrete_gaussian(variance, count, stream=stream)
    return stream.drawn / count


def stream(count: int) -> np.ndarray:
    return KeyStream().words(count)


def numpy_rounded_normal(rng: np.random.Generator, variance: int, count: int) -> np.ndarray:
    return np.rint(rng.normal(0.0, variance**0.5, count)).astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    reference = np.random.default_rng(0)  # the non-cryptographic reference only
    print(
        "| entries | variance (grid units) | discrete gaussian s | words per entry | key stream alone s "
        "| numpy rint(normal) s (not exact, not a CSPRNG) |"
    )
    print("|---|---|---|---|---|---|")
    for count in args.counts:
        for variance in VARIANCES:
            ours = median_seconds(args.repeats, discrete_gaussian, variance, count)
            words = words_per_entry(variance, count)
            stream_s = median_seconds(args.repeats, stream, round(words * count))
            theirs = median_seconds(args.repeats, numpy_rounded_normal, reference, variance, count)
            cells = (f"{count:,}", f"2^{variance.bit_length() - 1}", f"{ours:.3f}", f"{words:.1f}", f"{stream_s:.3f}")
            print("| " + " | ".join(cells) + f" | {theirs:.3f} |")


if __name__ == "__main__":
    main()
