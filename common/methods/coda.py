"""CODA-Prompt (``coda-p``, Smith et al. 2023), federated by FedAvg: the shared part of its slice, its settings
(section ``coda``) and its registration. The server half is ``server/strategies/prompts.py``
(``CodaPrompt``), the client half ``client/methods/prompts.py`` (``CodaTrainer``); the components are
``common/adapters/prompts.py``, and its steps' declaration (a ``PromptStep``'s) and fold
(``common.aggregation.dense:prompts``) are L2P's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import Method
from common.run.settings import Settings, at_least_one, finite_number, setting


@dataclass(frozen=True)
class CodaSettings(Settings):
    """CODA-Prompt (``coda-p``), federated: FedAvg of the current task's prompt components and the head."""

    section: ClassVar[str] = "coda"
    components: int = setting(100, "prompt components of all tasks, components // tasks per task (100)")
    length: int = setting(8, "tokens per prompt (8)")
    ortho: float = setting(0.0, "weight of the orthogonality penalty on components, keys, attention (0: CODA-P's)")

    def __post_init__(self) -> None:
        at_least_one(self, "components", "length")
        finite_number("coda.ortho", self.ortho, 0.0)


METHOD = Method(
    "coda-p",
    "server.strategies.prompts:CodaPrompt",
    "client.methods.prompts:CodaTrainer",
    "CODA-Prompt: prompt components weighted by attended keys, grown per task, old ones frozen, FedAvg",
    CodaSettings,
    steps=frozenset({("train", "prompt")}),
    aggregator="common.aggregation.dense:prompts",
    open_schedule=False,  # components // tasks per task, the tasks counted at the start
)
