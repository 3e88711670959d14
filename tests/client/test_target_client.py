"""TARGET's synthesis on a toy teacher: its inputs are classified as the classes requested,
more so with more generator steps, and every client draws the same ones."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from client.classifier import build_model
from client.methods.target import logits_of, synthesize
from common.methods.target import TargetSettings
from common.run.config import RunConfig

CPU = torch.device("cpu")


def teacher(backbone: str):
    model = build_model(RunConfig(backbone=backbone, model_seed=3), 6).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def fit(model, settings: TargetSettings) -> tuple[float, float]:
    """The teacher's cross-entropy and accuracy on the synthetic inputs, against the requested classes."""
    x, y = synthesize(model, 4, settings, seed=11, device=CPU)
    with torch.no_grad():
        out = logits_of(model, x)[:, :4]
    return F.cross_entropy(out, y).item(), (out.argmax(1) == y).double().mean().item()


def test_synthetic_text_is_classified_as_requested_and_improves_with_generator_steps():
    model = teacher("tiny-bert")
    few = TargetSettings(rounds=3, steps=1, warmup=3, batch=8, tokens=4, latent=16)
    many = TargetSettings(rounds=3, steps=40, warmup=3, batch=8, tokens=4, latent=16)
    (ce_few, _), (ce_many, acc_many) = fit(model, few), fit(model, many)
    assert ce_many < ce_few / 2 and acc_many >= 0.9


def test_synthetic_images_for_a_vit_and_the_adversarial_student():
    model = teacher("tiny-vit")
    settings = TargetSettings(rounds=3, steps=25, warmup=1, batch=8, latent=16, student_steps=2)
    x, y = synthesize(model, 4, settings, seed=5, device=CPU)
    assert x.shape == (24, 3, 16, 16) and y.shape == (24,) and x.abs().max() <= 1
    with torch.no_grad():
        accuracy = (logits_of(model, x)[:, :4].argmax(1) == y).double().mean().item()
    assert accuracy >= 0.6  # chance: 0.25 (one generator step gives 0.25 here)
    again, _ = synthesize(model, 4, settings, seed=5, device=CPU)
    assert torch.equal(x, again)  # seeded: every client synthesises the same inputs


def test_the_students_rate_steers_the_adversarial_synthesis():
    """``target.student_lr`` trains the student whose disagreement the generator seeks after the warm-up: a
    different rate, different inputs once the student has trained (the third round of 8 inputs here: the
    second meets a fresh student); the rounds before are the same."""
    model = teacher("tiny-bert")
    base = dict(rounds=3, steps=5, warmup=1, batch=8, tokens=4, latent=16, student_steps=3)
    x, _ = synthesize(model, 4, TargetSettings(**base), seed=7, device=CPU)
    fast, _ = synthesize(model, 4, TargetSettings(**base, student_lr=0.5), seed=7, device=CPU)
    assert torch.equal(x[:16], fast[:16]) and not torch.equal(x[16:], fast[16:])
