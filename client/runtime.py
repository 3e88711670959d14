"""Everything a client builds from the run configuration alone: data, model, device."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from client.backbone_builders import build_backbone
from client.classifier import ClassifierModel, build_model, model_spec, reads_text
from client.datasets import load_dataset
from client.images import ImageData
from client.owned import OwnData, load_owned
from client.splits import DatasetError, Splits
from client.worker import ClientWorker, EncodedData, SampleData, resolve_device
from common.run.config import RunConfig
from common.run.schedule import Schedule, head_classes, with_schedule
from common.wire.messages import ModelSpec

log = logging.getLogger("lorm.client")


@dataclass
class ClientRuntime:
    config: RunConfig
    model: ClassifierModel
    train: SampleData
    test: SampleData
    device: torch.device
    owned: bool = False  # the client's own data (client/owned.py), not a Dirichlet shard of a common dataset
    classes: tuple[str, ...] | None = None  # head order, as the dataset names them; None: the run's schedule does

    @property
    def spec(self) -> ModelSpec:
        """The model this client describes: its shapes, the class names of its head's rows (a dataset's; with
        the client's own data the coordinator's schedule names them) and the tokens it keeps per sentence."""
        return model_spec(self.model, self.classes, self.config.max_length if reads_text(self.model) else 0)

    def worker(self, client_index: int, client_id: str) -> ClientWorker:
        return ClientWorker(
            self.config, client_index, client_id, self.model, self.train, self.test, self.device, owned=self.owned
        )


def sample_data(
    splits: Splits,
    model: ClassifierModel,
    max_length: int | None = None,
    lengths: list[int] | None = None,
    owned: bool = False,
) -> tuple[SampleData, SampleData]:
    """Text: both splits tokenised once, up front. Images: decoded and transformed per batch.
    ``lengths``: the training samples' token counts, when already counted; ``owned``: a client's own data, whose
    ``max_length`` the coordinator fixes for every site."""
    if (splits.kind == "image") == reads_text(model):
        raise ValueError(
            f"the dataset gives {splits.kind} samples but backbone {type(model.backbone).__name__} "
            f"takes {'text' if reads_text(model) else 'images'}; pick a matching dataset and backbone"
        )
    train_y, test_y = torch.from_numpy(splits.train_y), torch.from_numpy(splits.test_y)
    if splits.kind == "image":
        t = splits.transforms
        assert t is not None  # Splits.__post_init__: image splits carry transforms
        return ImageData(splits.train_x, train_y, t.train, t.test), ImageData(splits.test_x, test_y, t.train, t.test)
    if max_length and splits.train_x:
        warn_truncation(model, splits.train_x, max_length, lengths, owned)

    def encode(texts: list[Any]) -> dict[str, torch.Tensor]:
        # A client's own data may hold no test split (or no training sample): encode one empty text for the
        # inputs' names and widths, and keep none of its rows (a tokenizer may refuse an empty batch).
        inputs = model.backbone.encode(texts or [""])
        return {name: t[: len(texts)] for name, t in inputs.items()}

    return EncodedData(encode(splits.train_x), train_y), EncodedData(encode(splits.test_x), test_y)


PROBE_LENGTH = 512  # tokens the probe tokenizer keeps while it counts (BERT's and T5's usual limit)


def percentile_99(lengths: list[int]) -> int:
    """The token count that 99 % of the samples do not exceed (rounded up)."""
    return int(np.ceil(np.percentile(lengths, 99)))


def chosen_max_length(config: RunConfig, splits: Splits) -> tuple[int, list[int] | None]:
    """``max_length=0``: the 99th percentile of the training samples' token counts, rounded up to a
    multiple of 8 and capped by the model (every client counts the same split: the same number);
    and those counts (``None``: not a text model)."""
    backbone = build_backbone(dataclasses.replace(config, max_length=PROBE_LENGTH))
    lengths = backbone.token_lengths(splits.train_x)
    if not lengths:
        return PROBE_LENGTH, None  # not a text model: nothing reads it
    cap = backbone.max_tokens()
    chosen = min(cap, max(8, -(-percentile_99(lengths) // 8) * 8))
    log.info(
        "max_length 0: %d tokens (the training samples' 99th percentile, rounded up to a multiple of 8; "
        "the longest has %d, the model takes %d)",
        chosen,
        max(lengths),
        cap,
    )
    return chosen, lengths


def warn_truncation(
    model: ClassifierModel, texts: list[Any], max_length: int, lengths: list[int] | None = None, owned: bool = False
) -> float:
    """Warn (once per client) when ``max_length`` cuts training samples; returns the share cut.
    ``lengths``: the samples' token counts, when already counted (else the model's tokenizer counts). ``owned``: a
    site's own data, whose ``max_length`` is the coordinator's: the advice is for its operator."""
    lengths = lengths or model.backbone.token_lengths(texts)
    if not lengths:
        return 0.0
    cut = sum(n > max_length for n in lengths) / len(lengths)
    if cut > 0:
        p99, longest = percentile_99(lengths), max(lengths)
        # A max_length above the current one that keeps 99 % whole, or every sample when 99 % already are.
        fits, kept = (p99, "99 %") if p99 > max_length else (longest, "all")
        advice = (
            "the coordinator sets it for every site: tell its operator this site's number, which `lorm-sim "
            "--count-tokens FILE` prints (docs/DEPLOY.md), and it takes the largest of the sites'"
            if owned
            else f"--set max_length={fits} keeps {kept} of them whole"
        )
        log.warning(
            "max_length %d cuts %.1f %% of the training samples (their 99th percentile is %d tokens, the longest "
            "%d); %s",
            max_length,
            100 * cut,
            p99,
            longest,
            advice,
        )
    return cut


RANDOM_BACKBONES = ("tiny-bert", "tiny-t5", "tiny-vit")  # random init from a config: for tests
OWN_DATA_PRESETS = {"textfile": "text", "imagefolder": "images"}


def warn_random_backbone(config: RunConfig) -> bool:
    """Warn when a run trains a random-init test backbone on the user's own data; ``True`` if it did."""
    if config.dataset not in OWN_DATA_PRESETS or config.backbone not in RANDOM_BACKBONES:
        return False
    log.warning(
        "backbone %s is a small random-init model for tests, not a pretrained one: on your own data use "
        "--preset %s (a pretrained encoder), or --set backbone=...",
        config.backbone,
        OWN_DATA_PRESETS[config.dataset],
    )
    return True


# cuBLAS needs a fixed workspace for reproducible sums (CUDA's "Results reproducibility" notes);
# PyTorch refuses cuBLAS calls under deterministic algorithms without one of these two values.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")


def use_deterministic(enabled: bool) -> None:
    """With ``enabled``: PyTorch's deterministic kernels only (``torch.use_deterministic_algorithms``, so
    an op that has none raises naming itself instead of summing in a run-dependent order), cuDNN's
    deterministic algorithms without autotuning, and cuBLAS's fixed workspace (set here unless the
    environment chose one of the reproducible values; it must be in place before the process's first
    cuBLAS call, which the client's first step on the GPU is). On the CPU a run at a fixed thread count
    repeats bit for bit either way; this makes a GPU run do so, and an in-process GPU run match the same
    run over gRPC. Without ``enabled``: nothing changes (PyTorch's defaults stay)."""
    if not enabled:
        return
    if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_DETERMINISTIC[0]
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


@contextmanager
def process_settings_kept() -> Iterator[None]:
    """Put back on exit what :func:`build_runtime` sets for the whole process: torch's intra-op thread
    count, its deterministic-kernel switches (:func:`use_deterministic`) and ``CUBLAS_WORKSPACE_CONFIG``.
    A client process builds one runtime and keeps them; an in-process run wraps itself in this, so that
    a run's ``threads`` or ``deterministic`` does not carry into the next run of the same process (a
    grid runs its cells one after another in one)."""
    cudnn = torch.backends.cudnn
    threads, kernels = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    cudnn_state, workspace = (cudnn.deterministic, cudnn.benchmark), os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(kernels, warn_only=warn_only)
        cudnn.deterministic, cudnn.benchmark = cudnn_state
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


def build_runtime(config: RunConfig, own: OwnData | None = None, schedule: Schedule | None = None) -> ClientRuntime:
    """Load the dataset, build the model (seeded), and prepare both splits' samples.

    ``own``: this client's own data instead (``lorm-client --data``), its labels matched by name to
    ``schedule``, the run's classes task by task (from the coordinator's Join reply, or the configuration)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    use_deterministic(config.deterministic)
    warn_random_backbone(config)
    splits = load_dataset(config) if own is None else load_owned(config, needed_schedule(schedule), own)
    lengths = None
    if config.max_length == 0:
        chosen, lengths = chosen_max_length(config, splits)
        config = dataclasses.replace(config, max_length=chosen)
    model = build_model(config, head_classes(config, splits.num_classes))  # rows past the schedule: capacity
    train, test = sample_data(splits, model, config.max_length, lengths, owned=own is not None)  # counted once
    device = resolve_device(config.device)
    if own is not None:
        return ClientRuntime(config, model, train, test, device, owned=True)
    return ClientRuntime(config, model, train, test, device, classes=tuple(splits.class_names))


def with_tasks(runtime: ClientRuntime, schedule: Schedule, own: OwnData) -> ClientRuntime:
    """``runtime`` once the run's schedule grew (the operator appended tasks): the same model (its head has
    the rows, ``data.max_classes``), the configuration cutting ``schedule``, and this client's own data read
    again against it: the classes scheduled before keep their ids, a label now scheduled trains in its task."""
    config = with_schedule(runtime.config, schedule)
    train, test = sample_data(load_owned(config, schedule, own), runtime.model, config.max_length, owned=True)
    return dataclasses.replace(runtime, config=config, train=train, test=test)


def needed_schedule(schedule: Schedule | None) -> Schedule:
    """The run's schedule of classes, which a client's own data needs to name its labels by."""
    if schedule is None:
        raise DatasetError(
            "this client's own data (--data) is labelled by class name, but the run names no classes: the "
            "coordinator's configuration must set data.classes (dataset textfile or imagefolder), in task order"
        )
    return schedule


def owned_runtimes(config: RunConfig, schedule: Schedule | None, owns: list[OwnData]) -> list[ClientRuntime]:
    """Each client's runtime in one process (``lorm-sim`` with ``data.clients_dir``), client ``i`` on its own
    data ``owns[i]``: one model for all, as each client process builds the same one (the configuration fixes
    ``max_length`` for text: RunConfig refuses 0 with the clients' own data)."""
    first = build_runtime(config, owns[0], schedule)
    runtimes = [first]
    for own in owns[1:]:
        owned = load_owned(config, needed_schedule(schedule), own)
        train, test = sample_data(owned, first.model, config.max_length, owned=True)
        runtimes.append(dataclasses.replace(first, train=train, test=test))
    return runtimes
