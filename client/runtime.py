"""Everything a client builds from the run configuration alone: data, model, device."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from client.backbones import ClassifierModel, build_model, model_spec
from client.datasets import load_dataset
from client.worker import ClientWorker, EncodedData, resolve_device
from common.config import RunConfig
from common.messages import ModelSpec


@dataclass
class ClientRuntime:
    config: RunConfig
    model: ClassifierModel
    train: EncodedData
    test: EncodedData
    device: torch.device

    @property
    def spec(self) -> ModelSpec:
        return model_spec(self.model)

    def worker(self, client_index: int, client_id: str) -> ClientWorker:
        return ClientWorker(self.config, client_index, client_id, self.model, self.train, self.test, self.device)


def build_runtime(config: RunConfig) -> ClientRuntime:
    """Load the dataset, build the model (seeded), and encode both splits once."""
    if config.threads:
        torch.set_num_threads(config.threads)
    splits = load_dataset(config)
    model = build_model(config, splits.num_classes)
    encode = model.backbone.encode
    train = EncodedData(encode(splits.train_x), torch.from_numpy(splits.train_y))
    test = EncodedData(encode(splits.test_x), torch.from_numpy(splits.test_y))
    return ClientRuntime(config, model, train, test, resolve_device(config.device))
