"""Fault injection for crash-consistency tests: named points where a process can be killed.

``LORM_FAULT="name"`` (first hit), ``"name:nth"`` (the nth hit in this process) or
``"name:nth:stop"`` (SIGSTOP instead of SIGKILL: a stalled process, resumed by SIGCONT)
makes :func:`fault_point` ``name`` stop the process there; a line naming the point goes to
stderr just before. With the variable unset, a point costs one comparison.

Points, in protocol order (coordinator unless noted):

- ``join.committed``    a Join is committed to disk, not yet answered;
- ``push.receiving``    a Push's envelope and first tensor chunk are in, the rest not yet read;
- ``push.staged``       a submission is staged durably, not yet folded nor acknowledged;
- ``merge.fold``        one staged submission was folded into the step's running sums;
- ``merge.aggregated``  a step's merge is computed in memory, not yet committed;
- ``commit.tensors``    a generation's tensors are written, its meta.json and CURRENT not;
- ``commit.current``    CURRENT names the new generation; older ones and staging not dropped;
- ``eval.staged``       an evaluation report is staged, not yet acknowledged;
- ``export``            an export's adapter is written (a task's, then the final one), its head and card not yet;
- ``secagg.revealed``   a secure step's unmask answer is persisted, not yet acknowledged;
- ``secagg.restarted``  a secure step's fresh session is persisted, the abandoned masked inputs not dropped;
- ``client.push``       (client) a step's result is computed, not yet pushed (in a secure step:
  after its keys and sealed shares went out, before its masked input);
- ``client.masked``     (client) a secure step's share round has closed (the coordinator named its sharers) and the
  client's masked input is computed, not yet pushed: in a process hosting many clients, the first such hit comes
  after every one of its clients that the share round counts has shared.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

ENV = "LORM_FAULT"
POINTS = (
    "join.committed",
    "push.receiving",
    "push.staged",
    "merge.fold",
    "merge.aggregated",
    "commit.tensors",
    "commit.current",
    "eval.staged",
    "export",
    "secagg.revealed",
    "secagg.restarted",
    "client.push",
    "client.masked",
)


def _parse(spec: str) -> tuple[str, int, str]:
    parts = spec.split(":")
    name = parts[0]
    nth = parts[1] if len(parts) > 1 else "1"
    action = parts[2] if len(parts) > 2 else "kill"
    if len(parts) > 3 or name not in POINTS or not nth.isdigit() or int(nth) < 1 or action not in ("kill", "stop"):
        raise ValueError(
            f"{ENV} should be 'name', 'name:nth' or 'name:nth:stop' with nth >= 1 and name one of "
            f"{', '.join(POINTS)}; got {spec!r}"
        )
    return name, int(nth), action


_ARMED = _parse(os.environ[ENV]) if os.environ.get(ENV) else None
_hits = itertools.count(1)  # next() is atomic under the GIL: concurrent pushes count once each


def fault_point(name: str) -> None:
    """Kill (or stop) this process here if ``LORM_FAULT`` names this point and this is its nth hit."""
    if _ARMED is None or _ARMED[0] != name:
        return
    hit = next(_hits)
    if hit != _ARMED[1]:
        return
    how = signal.SIGKILL if _ARMED[2] == "kill" else signal.SIGSTOP
    os.write(2, f"LORM_FAULT: {how.name} at {name} (hit {hit})\n".encode())
    os.kill(os.getpid(), how)


def after_items(items: Iterable[T], name: str, count: int) -> Iterable[T]:
    """``items`` with :func:`fault_point` ``name`` reached once ``count`` of them have been taken."""
    if _ARMED is None or _ARMED[0] != name:
        return items
    return _counted(items, name, count)


def _counted(items: Iterable[T], name: str, count: int) -> Iterator[T]:
    for taken, item in enumerate(items, start=1):
        yield item
        if taken == count:
            fault_point(name)
