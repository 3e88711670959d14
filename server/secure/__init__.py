"""Secure aggregation on the coordinator's side: the coordinator learns only the survivors' sums.

Each client folds its own update into a fresh aggregator of the step (so that what it masks is what the
coordinator would have folded), encodes the running sums in fixed point and masks them
(``common/secagg/terms.py``, ``common/secagg/client_session.py``). Here: what a method must allow
(:mod:`server.secure.sums`), the step's rounds over the wire as a state machine (:mod:`server.secure.step`; its
stages' handlers :mod:`server.secure.stages`, its masked inputs :mod:`server.secure.masked`, the staging it is
lent :mod:`server.secure.staging`), and what a step records (:mod:`server.secure.report`). The protocol's rounds
driven among in-process parties without a coordinator, for the tests and the cost bench: ``lab/secure_rounds.py``.
"""

from server.secure.report import added_counts, secagg_report, secagg_text
from server.secure.staging import Staging
from server.secure.step import SecureStep, SessionFailed, Timing
from server.secure.sums import check_sums, load_sums, require_secure

__all__ = [
    "SecureStep",
    "SessionFailed",
    "Staging",
    "Timing",
    "added_counts",
    "check_sums",
    "load_sums",
    "require_secure",
    "secagg_report",
    "secagg_text",
]
