"""What a per-sample Fisher costs: a backward pass per sample (fisher_batch=1; its time split into the
forward and backward pass and the float32 in-place sum of the squares, beside the float64 sum it
replaced), against one batched pass per
``--batch`` samples with each sample's gradient rebuilt from the layers' rows (client/persample.py).
Both give the same Fisher up to rounding (printed: the largest relative difference of any tensor).

    .venv/bin/python bench/fisher_speed.py [--backbone minilm] [--samples 64] [--batch 16] [--threads 1]

With ``LORM_DATA_DIR`` set, the samples are CLINC150's first training utterances; otherwise one sentence.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from client.backbone_builders import build_backbone
from client.classifier import ClassifierModel
from client.datasets import load_dataset
from client.persample import PerSampleSquares
from common.run.config import RunConfig


def texts(count: int) -> list[str]:
    if not os.environ.get("LORM_DATA_DIR"):
        return ["what is the weather like in paris today"] * count
    splits = load_dataset(RunConfig(dataset="clinc150", num_tasks=5, train_per_class=count // 150 + 1))
    return list(splits.train_x[:count])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="minilm")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = ClassifierModel(build_backbone(RunConfig(backbone=args.backbone, max_length=64)), 150, 1).eval()
    inputs = model.backbone.encode(texts(args.samples))
    lengths = inputs["attention_mask"].sum(1)
    params = {n: p for n, p in model.named_parameters() if ".lora_" not in n}
    for p in params.values():
        p.requires_grad_(True)
    labels = torch.arange(args.samples) % 30

    loop = {n: torch.zeros_like(p) for n, p in params.items()}
    wide = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in params.items()}  # the old accumulation
    timing = {"forward and backward": 0.0, "float64 sum (the old accumulation)": 0.0, "float32 in place": 0.0}
    for i in range(args.samples):
        start = time.perf_counter()
        one = {k: v[i : i + 1, : int(lengths[i])] for k, v in inputs.items()}
        log_p = F.log_softmax(model(one)[0][:, :30], 1)
        grads = torch.autograd.grad(log_p[0, labels[i]], list(params.values()), allow_unused=True)
        mid = time.perf_counter()
        for acc, g in zip(wide.values(), grads):
            if g is not None:
                acc += g.detach().double() ** 2
        end = time.perf_counter()
        for acc, g in zip(loop.values(), grads):
            if g is not None:
                acc.addcmul_(g, g)
        timing["forward and backward"] += mid - start
        timing["float64 sum (the old accumulation)"] += end - mid
        timing["float32 in place"] += time.perf_counter() - end

    batched = {n: torch.zeros_like(p) for n, p in params.items()}
    squares = PerSampleSquares(model, params, batched)
    start = time.perf_counter()
    for s in range(0, args.samples, args.batch):
        width = int(lengths[s : s + args.batch].max())
        part = {k: v[s : s + args.batch, :width] for k, v in inputs.items()}
        with squares.recording(part["input_ids"].shape[0]):
            log_p = F.log_softmax(model(part)[0][:, :30], 1)
        rows = torch.arange(log_p.shape[0])
        squares.add(log_p[rows, labels[s : s + args.batch]].sum(), torch.ones(log_p.shape[0]))
    timing[f"batched, {args.batch} a pass"] = time.perf_counter() - start

    count = sum(p.numel() for p in params.values())
    print(
        f"{args.backbone}: {count / 1e6:.1f} M parameters, {args.threads} thread(s), {args.samples} samples "
        f"of {float(lengths.float().mean()):.1f} tokens on average"
    )
    for what, seconds in timing.items():
        print(f"  {what}: {1000 * seconds / args.samples:.1f} ms per sample")
    per_sample = timing["forward and backward"] + timing["float32 in place"]
    print(f"  speed-up of the batched pass: {per_sample / timing[f'batched, {args.batch} a pass']:.2f}x")
    largest = max(float(t.abs().max()) for t in loop.values())
    worst = max(
        float((batched[n] - loop[n]).abs().max() / loop[n].abs().max())
        for n in params
        if float(loop[n].abs().max()) > 1e-12 * largest
    )
    print(f"  largest relative difference of a tensor: {worst:.1e}")


if __name__ == "__main__":
    main()
