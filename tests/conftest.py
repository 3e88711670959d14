"""Shared test settings: deterministic, single-threaded torch (tiny models run faster so), in the test
processes and in every process they start."""

import itertools
import os

# Set before torch is imported, and inherited by every coordinator, client and command a test starts:
# on 2 cores that the test workers' processes already share, a second OpenMP thread per process mostly
# spins waiting for work (the README's walk-through took 3x the CPU time with torch's default of 2).
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.hookimpl(trylast=True)  # after -m and -k deselected theirs: the parts are of what runs
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the long tests (``@pytest.mark.long(seconds)``) go first, spread over the workers.

    ``--dist worksteal`` hands worker k the k-th of n equal parts of the collection, in order, and a worker
    that runs out steals the back half of the longest queue. In collection order the longest tests (the
    README's walk-throughs, the secure-aggregation runs) came last, so one worker was often still in a
    50-second test while the other had nothing left. Here each part begins with its share of the long tests
    (the longest first, each to the part with the least so far) and the short ones follow and fill the end.
    Every worker reorders its collection the same way (it depends only on the collection and the count)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    marked = [(item.get_closest_marker("long"), item) for item in items]
    long = sorted(((m.args[0], i) for i, (m, _) in enumerate(marked) if m is not None), reverse=True)
    if workers < 2 or not long:
        return
    parts: list[list[pytest.Item]] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for seconds, index in long:
        k = load.index(min(load))
        parts[k].append(items[index])
        load[k] += seconds
    rest = iter(item for m, item in marked if m is None)
    remaining = len(items)
    for k, part in enumerate(parts):
        size = remaining // (workers - k)  # worksteal's first share for worker k
        remaining -= size
        part.extend(itertools.islice(rest, max(size - len(part), 0)))  # fewer where the long tests took more
    parts[-1].extend(rest)
    items[:] = [item for part in parts for item in part]
