"""What a secure step leaves in the run's history and log."""

from __future__ import annotations

from common.aggregation.base import Aggregator
from common.secagg.server_session import ServerSession


def added_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Bytes per round of ``a`` and ``b`` together."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in a | b}


def secagg_report(
    session: ServerSession,
    clients: int,
    aggregator: Aggregator,
    attempt: int = 0,
    earlier: dict | None = None,
    failures: list[str] | None = None,
    excluded: dict[int, str] | None = None,
) -> dict:
    """What a secure step's history entry records: who finished, the samples their unmasked sum
    counts, the bytes each round brought in (``earlier``: those of the step's abandoned sessions,
    added), and which session finished (``attempt``: 0 unless the step was restarted). After a
    restart also why each earlier session failed (``failures``) and the clients caught deviating and
    left out of the step (``excluded``: client -> what it did), so the record outlives the log. Complaints of
    the unmask answers about boxes that did not open: the clients they proved at fault (``blamed``: client ->
    what it did; the sum was rebuilt without those pairs' shares) and those nobody can be named for
    (``complaints``)."""
    survivors, dropped = session.close_inputs()
    received = added_counts(session.received, earlier or {})
    report: dict[str, object] = {
        "survivors": len(survivors),
        "samples": aggregator.num_samples,
        "dropped": dropped,
        "threshold": session.threshold,
        # whom each client shared with and masked against: every other client, or its k neighbours on a sparse graph
        "graph": "complete" if session.graph is None else "sparse",
        "neighbours": clients - 1 if session.graph is None else session.graph.k,
        "attempt": attempt,
        "bytes_received": received,
        "bytes_per_client": sum(received.values()) / clients,
    }
    if failures:
        report["failed"] = list(failures)
    if excluded:
        report["excluded"] = {str(i): why for i, why in sorted(excluded.items())}
    blamed, unresolved = session.complaint_verdicts()
    if blamed:
        report["blamed"] = {str(i): why for i, why in sorted(blamed.items())}
    if unresolved:
        report["complaints"] = unresolved
    return report


def secagg_text(report: dict) -> str:
    dropped = f", dropped {report['dropped']}" if report["dropped"] else ""
    return f" [secure sum of {report['survivors']} clients{dropped}, {report['bytes_per_client'] / 1e6:.2f} MB/client]"
