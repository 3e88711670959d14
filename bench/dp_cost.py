"""What differential privacy costs a trained method's client, per step: DP-SGD's step (Poisson batch, each sample's
gradient norm from the batched per-sample machinery, the clipped sum by a second backward pass, the noise) against
the plain step of the same batch, and LoRM's private Gram pass (per-sample energy clip, the noise) against the plain
one; for LoRA (LoRM: the B factor and the head) and full fine-tuning (FedAvg: every backbone weight and the head).

    .venv/bin/python bench/dp_cost.py [--backbone minilm] [--batch 16] [--steps 8] [--threads 1]

With ``LORM_DATA_DIR`` set, the samples are CLINC150's first training utterances; otherwise one sentence. Bytes are
not measured here: a private step sends the tensors of a plain one, of the same shapes (the noise changes values,
not sizes), which ``tests/server/test_trained_dp.py`` runs end to end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from client.backbone_builders import build_backbone
from client.classifier import ClassifierModel
from client.datasets import load_dataset
from client.dpsgd import PerSampleNorms, gradient_noise, private_step
from common.adapters.lora import GramRecorder
from common.run.config import RunConfig


def texts(count: int) -> list[str]:
    if not os.environ.get("LORM_DATA_DIR"):
        return ["what is the weather like in paris today"] * count
    splits = load_dataset(RunConfig(dataset="clinc150", num_tasks=5, train_per_class=count // 150 + 1))
    return list(splits.train_x[:count])


def median_seconds(run: Callable[[], None], repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def training_rows(
    model: ClassifierModel, inputs: dict[str, torch.Tensor], labels: torch.Tensor, trained: str, repeats: int
) -> list[tuple[str, float, float]]:
    """The plain and the private step of one batch, training ``trained`` ("lora": B and the head; "dense": every
    backbone weight and the head), the private one with seeded and with CSPRNG noise."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = {
        n: p
        for n, p in model.named_parameters()
        if (n.endswith(".lora_B") if trained == "lora" else ".lora_" not in n) or n.startswith("head.")
    }
    for p in params.values():
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(list(params.values()), lr=1e-3)
    norms = PerSampleNorms(model, params)
    batch = labels.numel()

    def plain() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(inputs)[0][:, :30], labels).backward()
        optimizer.step()

    def private(seed: int) -> Callable[[], None]:
        def step() -> None:
            with norms.recording(batch):
                losses = F.cross_entropy(model(inputs)[0][:, :30], labels, reduction="none")
            noise = gradient_noise(seed, 0, 0, 0)
            private_step(list(params.values()), norms, losses, 1.0, 0.76, float(batch), noise)
            optimizer.step()

        return step

    count = sum(p.numel() for p in params.values())
    base = median_seconds(plain, repeats)
    return [
        (f"{trained} step, {count:,} trained, {label}", base, median_seconds(private(seed), repeats))
        for label, seed in (("seeded noise", 0), ("CSPRNG noise", -1))
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="minilm")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=8, help="timed repeats of each step (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = RunConfig(backbone=args.backbone, max_length=64, rank=1)
    model = ClassifierModel(build_backbone(config), 150, 1).train()
    inputs = model.backbone.encode(texts(args.batch))
    labels = torch.arange(args.batch) % 30
    rows = [row for trained in ("lora", "dense") for row in training_rows(model, inputs, labels, trained, args.steps)]
    for p in model.parameters():
        p.requires_grad_(False)
    modules: dict[str, torch.nn.Module] = {**model.lora(), "<head>": model.head}
    full = {name: name == "<head>" for name in modules}

    def gram_pass(clip: float | None) -> Callable[[], None]:
        def run() -> None:
            recorder = GramRecorder(modules, full, energy_clip=clip)
            recorder.row_mask = inputs["attention_mask"]
            with torch.no_grad(), recorder.recording():
                model(inputs)
            if clip is not None:
                source = gradient_noise(0, 0, 0, 0, kind="gram")
                for gram in recorder.result().values():
                    gram.add_(source.normal(tuple(gram.shape)))

        return run

    model.eval()
    rows.append(
        (
            f"Gram pass ({len(modules) - 1} diagonals + the head's full Gram)",
            median_seconds(gram_pass(None), args.steps),
            median_seconds(gram_pass(1.0), args.steps),
        )
    )
    print(f"{args.backbone}, batch {args.batch}, {args.threads} thread(s), median of {args.steps}")
    print("| what | plain s | private s | ratio |")
    print("|---|---|---|---|")
    for label, base, t in rows:
        print(f"| {label} | {base:.3f} | {t:.3f} | {t / base:.2f}x |")


if __name__ == "__main__":
    main()
