"""Tasks, the Dirichlet split, test shares, and the class-incremental metrics."""

import numpy as np
import pytest

from common.run.metrics import AccuracyMatrix
from common.run.partition import client_test_indices, dirichlet_partition, task_ranges


def test_task_ranges_contiguous_and_covering():
    assert task_ranges(150, 5) == [(0, 30), (30, 60), (60, 90), (90, 120), (120, 150)]
    assert task_ranges(10, 3) == [(0, 3), (3, 6), (6, 10)]
    cars = task_ranges(196, 10, [20] * 9 + [16])
    assert cars[-1] == (180, 196) and all(hi - lo == 20 for lo, hi in cars[:-1])
    with pytest.raises(ValueError, match="summing to 196"):
        task_ranges(196, 10, [20] * 10)
    with pytest.raises(ValueError):
        task_ranges(3, 4)


def labels(classes=6, per_class=40):
    return np.repeat(np.arange(classes), per_class)


@pytest.mark.parametrize("beta", [0.1, 0.5, 5.0])
def test_partition_disjoint_covering_and_min_samples(beta):
    y = labels()
    tasks = task_ranges(6, 2)
    shards = dirichlet_partition(y, tasks, num_clients=4, beta=beta, seed=3, min_samples=6)
    for t, (lo, hi) in enumerate(tasks):
        allidx = np.concatenate(shards[t])
        assert len(allidx) == len(set(allidx.tolist()))  # disjoint
        assert set(allidx.tolist()) == set(np.flatnonzero((y >= lo) & (y < hi)).tolist())  # covering
        assert min(len(s) for s in shards[t]) >= 6


def test_partition_deterministic_per_seed_and_skewed_by_beta():
    y = labels(6, 200)
    tasks = task_ranges(6, 1)
    a = dirichlet_partition(y, tasks, 5, 0.5, seed=1)
    b = dirichlet_partition(y, tasks, 5, 0.5, seed=1)
    c = dirichlet_partition(y, tasks, 5, 0.5, seed=2)
    assert all(np.array_equal(x, z) for x, z in zip(a[0], b[0]))
    assert not all(np.array_equal(x, z) for x, z in zip(a[0], c[0]))

    def skew(beta):  # mean over clients of the largest class share
        shards = dirichlet_partition(y, tasks, 5, beta, seed=4)[0]
        return np.mean([np.bincount(y[s], minlength=6).max() / len(s) for s in shards])

    assert skew(0.05) > skew(100.0) + 0.3


def test_partition_impossible_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than"):
        dirichlet_partition(labels(2, 5), [(0, 2)], num_clients=3, beta=1.0, seed=0, min_samples=6)


def test_test_shares_partition_the_test_set():
    shares = [client_test_indices(23, 4, i) for i in range(4)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(23))


def test_metrics_by_hand():
    m = AccuracyMatrix()
    m.add(0, [8], [10])
    m.add(1, [3, 9], [5, 10])  # two clients' counts add up
    m.add(1, [3, 9], [5, 10])
    acc = m.accuracy()
    assert acc == [[80.0], [60.0, 90.0]]
    assert m.faa() == pytest.approx(75.0)
    assert m.faa_weighted() == pytest.approx(100 * 24 / 30)
    assert m.forgetting() == pytest.approx(20.0)
    with pytest.raises(ValueError):
        m.add(1, [1], [2])


def test_num_tasks_zero_takes_the_number_from_the_data():
    from common.run.config import RunConfig
    from common.run.partition import auto_num_tasks, describe_tasks

    assert [auto_num_tasks(c) for c in (150, 10, 9, 6, 3, 1)] == [5, 5, 4, 3, 1, 1]  # 5, each task >= 2 classes
    assert auto_num_tasks(196, [20] * 9 + [16]) == 10  # task sizes name the tasks
    assert task_ranges(6, 0) == [(0, 2), (2, 4), (4, 6)]
    assert task_ranges(196, 0, [20] * 9 + [16])[-1] == (180, 196)
    assert RunConfig(num_tasks=0).num_tasks == 0
    with pytest.raises(ValueError, match="num_tasks must be >= 1, or 0 to choose it from the data"):
        RunConfig(num_tasks=-1)
    assert describe_tasks(task_ranges(6, 0), chosen=True).startswith(
        "6 classes in 3 tasks of 2 classes each (num_tasks=0"
    )
    assert describe_tasks([(0, 3), (3, 7)], chosen=False) == "7 classes in 2 tasks of [3, 4] classes"
