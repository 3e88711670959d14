"""CCVR (Luo et al. 2021): FedAvg, then the head calibrated on virtual representations; the shared part of its
slice, its settings and its registration. The server half is ``server/strategies/ccvr.py``, the client half
``client/methods/features.py`` (``DenseThenFeatures``: full fine-tuning steps, then a features step with the
per-class second moments, which the settings describe, ``feature_stats``); that step is the closed-form heads'
way of training, declared in ``common/aggregation/declared.py`` and folded in ``common/aggregation/features.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.aggregation.declared import FeatureStats
from common.methods import DENSE_ROUNDS, FEATURES_STEP, Method
from common.run.config import RunConfig
from common.run.settings import Settings, at_least_one, finite_number, setting


@dataclass(frozen=True)
class CcvrSettings(Settings):
    """Classifier calibration with virtual representations (``ccvr``): FedAvg, then the head re-trained
    at each task's end on features drawn from the merged per-class Gaussians."""

    section: ClassVar[str] = "ccvr"
    covariance: str = setting("full", "'full' per-class covariances (CCVR's), or 'diag' (the paper's code)")
    samples: int = setting(256, "virtual features per class and epoch (the paper's code: 256)")
    epochs: int = setting(5, "epochs of head training on virtual features (5)")
    lr: float = setting(0.01, "SGD learning rate of that training, cosine-annealed over the epochs (0.01)")
    momentum: float = setting(0.9, "SGD momentum (0.9)")
    logit_norm: float = setting(
        0.1, "temperature of the logits divided by their norm (the paper's code: 0.1); 0: plain cross-entropy"
    )

    def __post_init__(self) -> None:
        if self.covariance not in ("full", "diag"):
            raise ValueError(f"setting ccvr.covariance must be 'full' or 'diag', got {self.covariance!r}")
        at_least_one(self, "samples", "epochs")
        finite_number("ccvr.lr", self.lr, 0.0, strict=True)
        finite_number("ccvr.momentum", self.momentum, 0.0)
        finite_number("ccvr.logit_norm", self.logit_norm, 0.0)

    def feature_stats(self, config: RunConfig) -> FeatureStats:
        """Its features step: the class sums, counts and second moments (``covariance``) of the backbone's own
        features, the ones its head scores (never mapped by the closed-form heads' ``ncm`` section: a ``ncm.rp_dim``
        there once made the moments wider than the head they calibrate)."""
        return FeatureStats(moments=self.covariance)


METHOD = Method(
    "ccvr",
    "server.strategies.ccvr:CCVR",
    "client.methods.features:DenseThenFeatures",
    "CCVR: FedAvg, then the head re-trained on virtual features of the merged per-class Gaussians",
    CcvrSettings,
    steps=DENSE_ROUNDS | FEATURES_STEP,
    aggregator="common.aggregation.features:ccvr",
)
