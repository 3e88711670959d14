"""Learning to prompt (L2P, Wang et al. 2022), federated by FedAvg: the shared part of its slice, its settings
and its registration. The server half is ``server/strategies/prompts.py`` (``L2P``), the client half
``client/methods/prompts.py`` (``L2pTrainer``); the pool is ``common/adapters/prompts.py``, and its steps'
declaration (a ``PromptStep``'s) and fold (``common.aggregation.dense:prompts``) are CODA-Prompt's too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import Method
from common.run.settings import Settings, at_least_one, finite_number, setting


@dataclass(frozen=True)
class L2pSettings(Settings):
    """Learning to prompt (``l2p``), federated: FedAvg of the prompt pool, its keys and the head."""

    section: ClassVar[str] = "l2p"
    pool: int = setting(10, "prompts in the pool (the paper's code: 10)")
    length: int = setting(5, "tokens per prompt (the paper's code: 5)")
    top_k: int = setting(5, "prompts chosen per sample by query-key matching, prepended together (5)")
    pull: float = setting(
        0.1, "weight of the surrogate matching loss sum_i (1 - cos(q, k_si)) (L2P's 0.1; the paper's code: none)"
    )
    init: float = setting(
        1.0, "prompts and keys start U(-init, init) (L2P's: 1; a prompt token's norm is then sqrt(F/3) init)"
    )
    features: str = setting(
        "prompts",
        "the head's input: 'prompts', the mean of the prompt positions' states (L2P's), or 'pooled', "
        "the backbone's own pooling of the prompted sequence",
    )

    def __post_init__(self) -> None:
        if self.features not in ("prompts", "pooled"):
            raise ValueError(f"setting l2p.features must be 'prompts' or 'pooled', got {self.features!r}")
        at_least_one(self, "pool", "length", "top_k")
        if self.top_k > self.pool:
            raise ValueError(f"setting l2p.top_k ({self.top_k}) must not exceed l2p.pool ({self.pool})")
        finite_number("l2p.pull", self.pull, 0.0)
        finite_number("l2p.init", self.init, 0.0, strict=True)


METHOD = Method(
    "l2p",
    "server.strategies.prompts:L2P",
    "client.methods.prompts:L2pTrainer",
    "L2P: a prompt pool on the frozen backbone, top-k prompts by query-key matching, FedAvg",
    L2pSettings,
    steps=frozenset({("train", "prompt")}),
    aggregator="common.aggregation.dense:prompts",
)
