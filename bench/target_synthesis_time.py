"""What TARGET's synthesis costs on this machine: seconds per generator step (with and without the
adversarial student) and per student step, on all-MiniLM-L6-v2 with one thread, for a teacher of 30
old classes; then the estimate for the default settings (30 rounds x 80 steps, 20 warm-up, 50
student steps). Usage: .venv/bin/python bench/target_synthesis_time.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.classifier import ClassifierModel, build_model  # noqa: E402
from client.methods.target import synthesize  # noqa: E402
from common.methods.target import TargetSettings  # noqa: E402
from common.run.config import RunConfig  # noqa: E402


def seconds(model: ClassifierModel, settings: TargetSettings) -> float:
    start = time.perf_counter()
    synthesize(model, 30, settings, seed=1, device=torch.device("cpu"))
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    model = build_model(RunConfig(backbone="minilm", max_length=32), 60).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    plain = seconds(model, TargetSettings(rounds=2, steps=10, warmup=2)) / 20
    adversarial = seconds(model, TargetSettings(rounds=2, steps=10, warmup=0, student_steps=0)) / 20
    student = (seconds(model, TargetSettings(rounds=2, steps=1, warmup=0, student_steps=10)) - 2 * adversarial) / 20
    d = TargetSettings()
    total = d.warmup * d.steps * plain + (d.rounds - d.warmup) * (d.steps * adversarial + d.student_steps * student)
    print(f"generator step: {plain:.3f} s; with the adversarial student: {adversarial:.3f} s; ", end="")
    print(f"student step: {student:.3f} s")
    print(f"default synthesis (once per task and process): about {total / 60:.1f} min")


if __name__ == "__main__":
    main()
