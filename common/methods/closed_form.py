"""The closed-form heads on frozen features, the shared part of their slice: the feature map's settings
(:class:`NcmSettings`, which :class:`RidgeSettings` extends with the ridge's lambda and its ensemble) and the
registration of the five methods that solve such a head: ``ncm`` and ``ridge`` on ``W0``, and ``lorm-ncm``,
``lorm-ridge`` and ``lorm-ridge-first`` on LoRM's backbone. Their server halves are
``server/strategies/closed_form.py`` and ``lorm_closed_form.py``, the client halves
``client/methods/features.py`` (the statistics of ``client/features.py``). The settings describe what their
features step computes and sends (``feature_stats``: the feature map, the Gram's blocks, the held-out rule), the
way of training's declaration in ``common/aggregation/declared.py`` reads it, and the sums fold in
``common/aggregation/features.py``, which CCVR's features step shares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from common.aggregation.declared import FeatureMap, FeatureStats
from common.methods import FEATURES_STEP, LORM_STEPS, Method
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings, Settings, is_sha256_hex, non_negative_int, setting

FEATURES = "client.methods.features:FeatureStatistics"  # no training: frozen-feature statistics
LORA_THEN_FEATURES = "client.methods.features:LoRAThenFeatures"  # LoRA steps, then features steps

POOLS = ("mean", "first")
LAMBDA_RULES = ("auto", "members", "average")
NORMS = ("none", "layer")
ACTIVATIONS = ("relu", "gelu", "tanh", "none")


@dataclass(frozen=True)
class NcmSettings(Settings):
    """Cosine nearest class mean (``ncm``, ``lorm-ncm``): the feature map of the closed-form head."""

    section: ClassVar[str] = "ncm"
    rp_dim: int = setting(0, "width F' of the random projection + activation before the head (0: none, F' = F)")
    activation: str = setting(
        "relu",
        "with rp_dim: the function of each projected feature, 'relu' max(0, z) (the arc-cosine kernel's random "
        "features), 'gelu', 'tanh', or 'none' (a linear projection); the projection is unscaled N(0, 1), so z has "
        "a deviation of |x| (about 34 for three layer-normed MiniLM layers): there gelu acts as relu, tanh as sign",
    )
    layers: tuple[int, ...] = setting(
        (),
        "hidden states pooled and concatenated as the head's features, indexed as the backbone's hidden "
        "states (0: the embeddings, 1..L: the blocks, -1: the last); empty: the backbone's own features",
    )
    pool: str = setting(
        "mean", "with layers: pool each hidden state by its 'mean' over the tokens kept, or 'first' token"
    )
    norm: str = setting(
        "none",
        "with layers: 'layer' scales each pooled vector to mean 0 and deviation 1 over its dimensions "
        "(per sample: no statistics, exact under any split); 'none' leaves them",
    )
    prior_digest: str = setting(
        "",
        "a public prior (common/privacy/public_prior.py, written by lorm-prior): the SHA-256 of its centre and "
        "basis, which every client checks the plan's prior against before it applies it to the F features "
        "(x - m) W, before rp_dim and the clip ('': none)",
    )
    prior_k: int = setting(0, "with prior_digest: the prior's width k, the head's input width without rp_dim")
    prior_file: str = setting(
        "",
        "with prior_digest: the coordinator's copy of the prior (a path on its machine; read once, then kept in "
        "the run's state); clients never read it: the prior comes to them in the plans",
    )

    def __post_init__(self) -> None:
        non_negative_int(f"{self.section}.rp_dim", self.rp_dim, "0: no projection")
        if self.pool not in POOLS:
            raise ValueError(f"setting {self.section}.pool must be one of {list(POOLS)}, got {self.pool!r}")
        if self.norm not in NORMS:
            raise ValueError(f"setting {self.section}.norm must be one of {list(NORMS)}, got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"setting {self.section}.activation must be one of {list(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.activation != "relu" and not self.rp_dim:
            raise ValueError(
                f"setting {self.section}.activation applies to the random projection: "
                f"it needs {self.section}.rp_dim > 0"
            )
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"setting {self.section}.layers names a layer twice: {list(self.layers)}")
        non_negative_int(f"{self.section}.prior_k", self.prior_k, "0: no prior")
        if (self.prior_digest or self.prior_k or self.prior_file) and not (
            is_sha256_hex(self.prior_digest) and self.prior_k
        ):
            raise ValueError(
                f"settings {self.section}.prior_digest (64 lower-case hex digits) and {self.section}.prior_k (> 0) "
                f"name a public prior together, got {self.prior_digest[:80]!r} and {self.prior_k}"
                + (f" with {self.section}.prior_file" if self.prior_file else "")
                + ": lorm-prior prints them"
            )
        if not self.layers and (self.pool, self.norm) != ("mean", "none"):
            raise ValueError(
                f"settings {self.section}.pool and {self.section}.norm apply to the pooled hidden states of "
                f"{self.section}.layers, which is empty (the backbone's own features)"
            )

    def feature_map(self) -> FeatureMap:
        """How its features step maps a sample to the head's features."""
        return FeatureMap(
            self.rp_dim,
            self.activation,
            self.layers,
            self.pool,
            self.norm,
            prior=self.prior_k,
            prior_digest=self.prior_digest,
        )

    def feature_width(self, hidden: int) -> int:
        """``F``: the head's features before the projection, for hidden states of width ``hidden``."""
        return self.feature_map().feature_width(hidden)

    def head_width(self, hidden: int) -> int:
        """``F'``: the head's input width."""
        return self.feature_map().head_width(hidden)

    def feature_stats(self, config: RunConfig) -> FeatureStats:
        """Its features step: the class sums and counts of the mapped features (and their Gram's factor when the
        step asks), each sample's features clipped to ``dp.clip`` in a run with a privacy budget."""
        return FeatureStats(private_map(self.feature_map(), config))


def private_map(features: FeatureMap, config: RunConfig, blocks: int = 1) -> FeatureMap:
    """``features``, clipped per sample to ``dp.clip`` when the run has a privacy budget (``common/privacy/``); with
    ``blocks = K > 1`` (a Gram kept as ``K`` diagonal blocks) each block of a sample to ``dp.clip / sqrt(K)``."""
    dp = config.section(DpSettings)
    return replace(features, clip=dp.clip, clip_blocks=blocks) if dp.enabled else features


DEFAULT_LAMBDAS = tuple(10.0**k for k in range(-2, 8))  # a decade grid; one Cholesky each (F'=10,000: ~15 s)


@dataclass(frozen=True)
class RidgeSettings(NcmSettings):
    """Ridge regression heads (``ridge``, ``lorm-ridge``, ``lorm-ridge-first``)."""

    section: ClassVar[str] = "ridge"
    fixed_lambda: float = setting(0.0, "the ridge lambda (0: choose it from `lambdas` on held-out samples)")
    lambdas: tuple[float, ...] = setting(DEFAULT_LAMBDAS, "the lambdas to choose from (held-out squared error)")
    holdout: int = setting(
        5,
        "hold out training samples with global index i % holdout == 0 to choose lambda "
        "(0: none; then fixed_lambda is needed)",
    )
    blocks: int = setting(
        1,
        "K: an ensemble of K ridge heads, each on its own rp_dim-wide random projection, outputs averaged; "
        "clients send and the coordinator keeps only the K diagonal rp_dim x rp_dim blocks of the Gram "
        "(needs rp_dim; lambda is shared, chosen by lambda_rule)",
    )
    lambda_rule: str = setting(
        "auto",
        "with blocks > 1, the held-out error that chooses lambda: 'average' (the ensemble's own, averaged "
        "scores: clients send the held-out samples' whole-width Gram factor, the same bytes when a client holds "
        "out at most rp_dim samples; not with secure aggregation), 'members' (the K members' errors summed, from "
        "the held-out Gram's diagonal blocks), or 'auto' (average, members with secure aggregation); with "
        "blocks = 1 all are the same",
    )
    views: int = setting(
        0,
        "dropout views: each training sample's features taken this many more times with the backbone's dropout "
        "on (a seeded draw per view), its clean features and its views entering the head's sums at weight "
        "1 / (1 + views) each, so a sample still counts once (bounds and privacy unchanged); the held-out "
        "samples that choose lambda are scored on their clean features, fitted without any of theirs "
        "(0: none)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.blocks < 1:
            raise ValueError(f"setting ridge.blocks must be a positive integer (1: one head), got {self.blocks}")
        if self.lambda_rule not in LAMBDA_RULES:
            raise ValueError(f"setting ridge.lambda_rule must be one of {list(LAMBDA_RULES)}, got {self.lambda_rule!r}")
        if self.blocks > 1 and not self.rp_dim:
            raise ValueError(
                f"setting ridge.blocks = {self.blocks} needs ridge.rp_dim > 0: each member of the ensemble is a "
                "ridge head on its own random projection"
            )
        if self.fixed_lambda < 0 or not math.isfinite(self.fixed_lambda):
            raise ValueError(
                f"setting ridge.fixed_lambda must be a positive number (0: choose it), got {self.fixed_lambda}"
            )
        non_negative_int("ridge.views", self.views, "0: none")
        if self.holdout < 0 or self.holdout == 1:
            raise ValueError(f"setting ridge.holdout must be 0 (none) or >= 2, got {self.holdout}")
        if not self.fixed_lambda and (self.holdout < 2 or not self.lambdas or min(self.lambdas) <= 0):
            raise ValueError(
                "ridge chooses lambda on held-out training samples: it needs ridge.holdout >= 2 "
                f"(got {self.holdout}) and positive ridge.lambdas (got {list(self.lambdas)}), "
                "or a fixed ridge.fixed_lambda > 0"
            )

    def inert(self) -> frozenset[str]:
        """``lambda_rule`` with one head (``blocks = 1``): every rule is the same."""
        return frozenset({"lambda_rule"}) if self.blocks == 1 else frozenset()

    def feature_map(self) -> FeatureMap:
        """The K members' projections side by side: ``K rp_dim`` rows of one projection, ``F' = K rp_dim``."""
        return replace(super().feature_map(), rp_dim=self.rp_dim * self.blocks)

    def feature_stats(self, config: RunConfig) -> FeatureStats:
        """Its features step: the Gram's ``K`` diagonal blocks, and the held-out samples' statistics too, their Gram
        whole by the ensemble's own held-out error (:meth:`average_rule`, by the run's secure aggregation)."""
        secure = config.section(SecAggSettings).enabled
        if config.section(DpSettings).enabled:  # lambda from the noise alone: no held-out statistics to noise
            return FeatureStats(private_map(self.feature_map(), config, self.blocks), self.blocks, views=self.views)
        return FeatureStats(self.feature_map(), self.blocks, self.holdout, self.average_rule(secure), views=self.views)

    def average_rule(self, secure: bool) -> bool:
        """Lambda by the ensemble's own held-out error: ``blocks > 1`` and ``lambda_rule`` 'average', or 'auto'
        without secure aggregation (``secure``), which can add up only the members' Gram blocks."""
        return self.blocks > 1 and (self.lambda_rule == "average" or (self.lambda_rule == "auto" and not secure))


def _no_views(config: RunConfig) -> bool:
    """A ridge head's sums hold no draws of a client's own (``ridge.views``: dropout views, drawn per client): its
    head is then the same under any split of the samples (its held-out samples are chosen by global index)."""
    return config.section(RidgeSettings).views == 0


METHODS = (
    Method(
        "ncm",
        "server.strategies.closed_form:NearestClassMean",
        FEATURES,
        "cosine nearest class mean on W0",
        NcmSettings,
        steps=FEATURES_STEP,
        aggregator="common.aggregation.features:ncm",
        private=True,
        sums_only=lambda config: True,
    ),
    Method(
        "ridge",
        "server.strategies.closed_form:RidgeHead",
        FEATURES,
        "ridge regression head on W0",
        RidgeSettings,
        steps=FEATURES_STEP,
        aggregator="common.aggregation.features:ridge",
        private=True,
        sums_only=_no_views,
    ),
    Method(
        "lorm-ridge",
        "server.strategies.lorm_closed_form:LoRMClosedForm",
        LORA_THEN_FEATURES,
        "LoRM's backbone with a ridge head",
        RidgeSettings,
        steps=LORM_STEPS | FEATURES_STEP,
        aggregator="common.aggregation.features:lorm_ridge",
    ),
    Method(
        "lorm-ncm",
        "server.strategies.lorm_closed_form:LoRMNearestClassMean",
        LORA_THEN_FEATURES,
        "LoRM's backbone with a cosine NCM head",
        NcmSettings,
        steps=LORM_STEPS | FEATURES_STEP,
        aggregator="common.aggregation.features:lorm_ncm",
    ),
    Method(
        "lorm-ridge-first",
        "server.strategies.lorm_closed_form:LoRMRidgeFirstTask",
        LORA_THEN_FEATURES,
        "LoRM on task 0 only, then ridge heads",
        RidgeSettings,
        steps=LORM_STEPS | FEATURES_STEP,
        aggregator="common.aggregation.features:lorm_ridge",
    ),
)
