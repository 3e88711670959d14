"""LoRM with VeRA modules (``lorm-vera``), the shared part of its slice: its settings and its registration.
The server half is ``server/strategies/vera.py``, the client half ``client/methods/vera.py``; the layer is
``common/adapters/vera.py`` (``adapter="vera"``), its merges ``common/merges/vectors.py``, and what its steps
declare and how they fold live with the other adapters' in ``common/aggregation/declared.py`` and
``common/aggregation/lora.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import Method
from common.run.settings import Settings, at_least_one, finite_number, setting


@dataclass(frozen=True)
class VeraSettings(Settings):
    """LoRM with VeRA modules (``lorm-vera``): frozen seeded random ``B, A`` per layer, trained vectors
    ``lb`` and ``ld`` merged in closed form (``../shared/SPEC.md`` §5)."""

    section: ClassVar[str] = "vera"
    rank: int = setting(64, "r: the width of the frozen random B (d_out, r) and A (r, d_in); ld has r entries")
    d_init: float = setting(0.1, "the value of every entry of ld at a task's start (lb starts at 0), as VeRA")
    form: str = setting(
        "exact",
        "exact: the least-squares merges of SPEC §5; appendix: the paper's appendix formulas "
        "(RegMean of the dense deltas, divided element-wise by the frozen matrix, row means)",
    )

    def __post_init__(self) -> None:
        at_least_one(self, "rank")
        finite_number("vera.d_init", self.d_init, 0.0)
        if self.form not in ("exact", "appendix"):
            raise ValueError(f"setting vera.form should be 'exact' or 'appendix', got {self.form!r}")


METHOD = Method(
    "lorm-vera",
    "server.strategies.vera:LoRMVeRA",
    "client.methods.vera:VeRATrainer",
    "LoRM with VeRA modules: alternating lb/ld rounds, closed-form merges",
    VeraSettings,
    adapter="vera",
    aggregator="common.aggregation.lora:vera",
    servable=True,
)
