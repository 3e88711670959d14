"""Federated methods as siblings behind one interface (``base.Strategy``)."""

from __future__ import annotations

from common.config import RunConfig
from common.messages import ModelSpec
from server.strategies.base import Aggregator, Strategy, UpdateRejected
from server.strategies.closed_form import NearestClassMean, RidgeHead
from server.strategies.fedavg import FedAvg
from server.strategies.fedavg_lora import FedAvgLoRA
from server.strategies.fisheravg import FisherAvg
from server.strategies.lorm import LoRM, LoRMAverageTasks, LoRMBOnly, LoRMSequential
from server.strategies.lorm_closed_form import LoRMClosedForm, LoRMNearestClassMean, LoRMRidgeFirstTask
from server.strategies.regmean import RegMean
from server.strategies.ties import Ties

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (LoRM, LoRMBOnly, LoRMAverageTasks, LoRMSequential, FedAvgLoRA, FedAvg, RegMean,
                           FisherAvg, Ties, NearestClassMean, RidgeHead, LoRMClosedForm, LoRMNearestClassMean,
                           LoRMRidgeFirstTask)}


def make_strategy(config: RunConfig, spec: ModelSpec) -> Strategy:
    if config.strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {config.strategy!r}; known: {sorted(STRATEGIES)}")
    return STRATEGIES[config.strategy](config, spec)


__all__ = ["Aggregator", "Strategy", "UpdateRejected", "STRATEGIES", "make_strategy"]
