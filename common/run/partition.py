"""Tasks as contiguous class ranges, and the reference Dirichlet split (docs/METHOD.md §5).

Pure and deterministic for a given seed, so every client computes its own shard locally and
no data (nor index lists) crosses the wire.
"""

from __future__ import annotations

import hashlib
import threading

import numpy as np

AUTO_TASKS = 5  # tasks when the run leaves their number to the data (the paper's CLINC150 and ImageNet-R splits)


def auto_num_tasks(num_classes: int, sizes: list[int] | None = None) -> int:
    """The number of tasks for ``num_tasks=0`` ("from the data"): one per entry of ``sizes`` when
    given, else 5, or fewer so that every task holds at least 2 classes."""
    if sizes:
        return len(sizes)
    return max(1, min(AUTO_TASKS, num_classes // 2))


def task_ranges(num_classes: int, num_tasks: int, sizes: list[int] | None = None) -> list[tuple[int, int]]:
    """Split classes ``0..num_classes-1`` into ``num_tasks`` contiguous ``[lo, hi)`` ranges.

    ``sizes`` gives the classes per task (Cars-196: ``[20] * 9 + [16]``); without it, sizes
    differ by at most one, larger tasks last. ``num_tasks=0``: as many as :func:`auto_num_tasks`.
    """
    if num_tasks == 0:
        num_tasks = auto_num_tasks(num_classes, sizes)
    if not 1 <= num_tasks <= num_classes:
        raise ValueError(f"need 1 <= num_tasks <= num_classes, got {num_tasks} tasks for {num_classes} classes")
    if sizes:
        if len(sizes) != num_tasks or min(sizes) < 1 or sum(sizes) != num_classes:
            raise ValueError(f"task sizes {list(sizes)} must be {num_tasks} positive numbers summing to {num_classes}")
    else:
        base, rest = divmod(num_classes, num_tasks)
        sizes = [base] * (num_tasks - rest) + [base + 1] * rest
    bounds = np.cumsum([0] + sizes)
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def describe_tasks(tasks: list[tuple[int, int]], chosen: bool) -> str:
    """One line for the log: how many tasks of how many classes, and whether the data chose it."""
    sizes = [hi - lo for lo, hi in tasks]
    shape = f"{sizes[0]} classes each" if len(set(sizes)) == 1 else f"{sizes} classes"
    why = " (num_tasks=0: chosen from the data; set num_tasks or task_sizes to change it)" if chosen else ""
    return f"{tasks[-1][1]} classes in {len(tasks)} tasks of {shape}{why}"


def client_shards(
    labels: np.ndarray,
    tasks: list[tuple[int, int]],
    num_clients: int,
    beta: float,
    seed: int,
    min_samples: int,
    client_index: int,
) -> list[np.ndarray]:
    """Client ``client_index``'s shard of each task (:func:`dirichlet_partition`), its own copies. The partition of
    the run is drawn once per process and kept (the last four): clients hosted in one process (``client/host.py``,
    the in-process engine) would otherwise each draw all ``n`` shards again, ``O(n^2)`` for the federation."""
    labels = np.ascontiguousarray(labels)
    digest = hashlib.sha256(labels.tobytes()).hexdigest()
    key = (digest, str(labels.dtype), tuple(map(tuple, tasks)), num_clients, beta, seed, min_samples)
    with _KEPT_LOCK:
        if key not in _KEPT:
            while len(_KEPT) >= 4:
                _KEPT.pop(next(iter(_KEPT)))
            _KEPT[key] = dirichlet_partition(labels, tasks, num_clients, beta, seed, min_samples)
        partition = _KEPT[key]
    return [task[client_index].copy() for task in partition]


_KEPT: dict[tuple, list[list[np.ndarray]]] = {}  # the last partitions drawn, by labels and arguments
_KEPT_LOCK = threading.Lock()


def dirichlet_partition(
    labels: np.ndarray,
    tasks: list[tuple[int, int]],
    num_clients: int,
    beta: float,
    seed: int,
    min_samples: int = 6,
    max_draws: int = 10_000,
) -> list[list[np.ndarray]]:
    """``shards[t][i]``: sorted indices of task ``t``'s training samples held by client ``i``.

    For each task and each of its classes, ``p ~ Dirichlet(beta * 1_N)``, and each sample of
    that class goes to a client drawn from ``Categorical(p)``. A task's split is redrawn until
    every client holds at least ``min_samples`` of its samples.
    """
    labels = np.asarray(labels)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    shards: list[list[np.ndarray]] = []
    for t, (lo, hi) in enumerate(tasks):
        rng = np.random.default_rng([seed, t])
        in_task = np.flatnonzero((labels >= lo) & (labels < hi))
        if len(in_task) < num_clients * min_samples:
            raise ValueError(
                f"task {t} has {len(in_task)} training samples, fewer than {num_clients} clients x "
                f"{min_samples} minimum samples each"
            )
        by_class = [np.flatnonzero(labels == c) for c in range(lo, hi)]
        for _ in range(max_draws):
            owner = np.empty(len(labels), dtype=np.int64)
            for idx in by_class:
                p = rng.dirichlet(np.full(num_clients, beta))
                owner[idx] = rng.choice(num_clients, size=len(idx), p=p)
            counts = np.bincount(owner[in_task], minlength=num_clients)
            if counts.min() >= min_samples:
                break
        else:
            raise RuntimeError(
                f"task {t}: no Dirichlet(beta={beta}) split gave every one of {num_clients} clients "
                f">= {min_samples} samples in {max_draws} draws; raise beta or lower min_client_samples"
            )
        shards.append([np.sort(in_task[owner[in_task] == i]) for i in range(num_clients)])
    return shards


def client_test_indices(num_samples: int, num_clients: int, client_index: int) -> np.ndarray:
    """The test samples a client evaluates: every ``num_clients``-th, starting at its index.

    The shares are disjoint and their union is the whole test set.
    """
    return np.arange(client_index, num_samples, num_clients)
