"""Where the time of a per-sample Fisher goes: one sample's forward and backward, against summing its
squared gradients into float64 (the old accumulation) or in float32 in place (client/methods/dense.py).

    .venv/bin/python bench/fisher_speed.py [--backbone minilm] [--samples 16] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from client.backbones import ClassifierModel, build_backbone
from common.config import RunConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="minilm")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = ClassifierModel(build_backbone(RunConfig(backbone=args.backbone, max_length=32)), 150, 1).eval()
    inputs = model.backbone.encode(["what is the weather like in paris today"] * args.samples)
    params = [p for n, p in model.named_parameters() if ".lora_" not in n]
    for p in params:
        p.requires_grad_(True)
    wide = [torch.zeros(p.shape, dtype=torch.float64) for p in params]
    narrow = [torch.zeros_like(p) for p in params]
    timing = {"forward and backward": 0.0, "float64 sum": 0.0, "float32 in place": 0.0}
    for i in range(args.samples):
        start = time.perf_counter()
        log_p = F.log_softmax(model({k: v[i : i + 1] for k, v in inputs.items()})[0][:, :30], 1)
        grads = torch.autograd.grad(log_p[0, 3], params, allow_unused=True)
        mid = time.perf_counter()
        for acc, g in zip(wide, grads):
            if g is not None:
                acc += g.detach().double() ** 2
        end = time.perf_counter()
        for acc, g in zip(narrow, grads):
            if g is not None:
                acc.addcmul_(g, g)
        timing["forward and backward"] += mid - start
        timing["float64 sum"] += end - mid
        timing["float32 in place"] += time.perf_counter() - end
    count = sum(p.numel() for p in params)
    print(f"{args.backbone}: {count / 1e6:.1f} M parameters, {args.threads} thread(s), {args.samples} samples")
    for what, seconds in timing.items():
        print(f"  {what}: {1000 * seconds / args.samples:.0f} ms per sample")


if __name__ == "__main__":
    main()
