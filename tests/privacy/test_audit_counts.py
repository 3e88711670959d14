"""Why the project states replace-one adjacency: every release carries exact counts (a class's ``class_count``
beside its noised class sums, a client's ``num_samples`` beside its noised update), and under add/remove adjacency
(``D'`` is ``D`` without the canary) a count tells the neighbours apart every time. No noise elsewhere can make up
for it: the empirical lower bound on epsilon grows as ``log n`` with the releases audited, past any epsilon one could
state. Under replace-one (the canary replaced by a record of the same class) the counts are the same on both sides
and show nothing."""

from __future__ import annotations

import math

import pytest
from audit_mechanisms import central_counts, update_counts


@pytest.mark.parametrize("counts", [central_counts, update_counts], ids=["class-count", "num-samples"])
def test_under_add_remove_the_released_count_is_a_perfect_distinguisher(counts):
    """A claim of add/remove DP with these counts released would be refuted by a threshold at the count of ``D'``:
    not one false positive nor false negative in 10^6 releases a side, a bound of ``log(n / 9)`` (11.6 at 10^6,
    above the stated epsilon and growing by ``log 1000`` from 10^3 releases): no epsilon holds."""
    few, many = counts(1000, remove=True), counts(10**6, remove=True)
    assert many.bound.epsilon > many.stated
    assert many.bound.epsilon - few.bound.epsilon == pytest.approx(math.log(1000), abs=0.01)
    for audit in (few, many):  # the best test is perfect: its rates are only the intervals' width
        n = audit.bound.samples
        assert audit.bound.false_positive < 10 / n and audit.bound.false_negative < 10 / n


@pytest.mark.parametrize("counts", [central_counts, update_counts], ids=["class-count", "num-samples"])
def test_under_replace_one_the_count_shows_nothing(counts):
    """Replacing the canary by ``-x`` of the same class leaves every count as it was: the count's bound is at most
    0, and the noised statistics carry the whole guarantee (their audits: ``test_audit_mechanisms.py``)."""
    audit = counts(10**5, remove=False)
    assert audit.bound.epsilon <= 0.0
