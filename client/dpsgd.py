"""DP-SGD on a client's local training (``common/privacy/training.py`` states the mechanism and its accounting).

Each step draws a Poisson sample of the shard (every record with probability ``q``), clips each sample's gradient
of the trained parameters to L2 norm ``C``, adds ``N(0, (z C)^2)`` to every coordinate of the clipped sum and
divides by the expected batch ``q n``; the optimiser then steps on that gradient as it would on a plain one.

Per-sample norms come from the project's own per-sample machinery (``client/persample.py``: one batched forward
pass, the layers' inputs and output gradients, each sample's weight gradient rebuilt from its own rows), extended
here to the LoRA layers' factors. Then one backward pass of ``sum_b c_b loss_b`` through the same graph (the same
dropout masks), ``c_b = min(1, C / |g_b|)``, gives the clipped sum ``sum_b c_b g_b`` exactly. Why not Opacus or
``torch.func``: ``torch.func.vmap`` stops at the data-dependent branches of transformers' attention masks, and
Opacus would wrap the model (its own module names, its own grad samplers for our LoRA layers) for the same sums;
the batched rebuild was already tested against the per-sample loop on every parameter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from client.persample import (
    PerSampleGradients,
    conv_tokens,
    embedding_rows,
    layer_norm_rows,
    layer_rule,
    linear_rows,
    tokens,
    vit_rows,
)
from common.adapters.lora import LoRALinear
from common.privacy.gaussian import BITS, NoiseSource, derived_seed, keyed_noise, secure_bits
from common.privacy.training import TrainingNoise

Norms = Callable[[nn.Module, dict[str, str], Tensor, Tensor, Tensor], None]


class PerSampleNorms(PerSampleGradients):
    """Each sample's squared L2 norm of its gradient of ``params`` (all of them together), from one forward pass
    recorded with :meth:`recording` and :meth:`norms` of its per-sample losses' sum."""

    covered = (
        "LoRA layers' factors, nn.Linear, nn.LayerNorm, plain nn.Embedding and nn.Conv2d layers, and a timm ViT's "
        "tokens (DP-SGD)"
    )

    def rule(self, module: nn.Module) -> Any:
        return norms_of(module)

    def norms(self, scalar: Tensor, retain: bool = True) -> Tensor:
        """``(batch,)``: ``|d s_b / d theta|^2`` for ``scalar = sum_b s_b``, float64."""
        out = torch.zeros(self.batch, dtype=torch.float64)
        for (module, x, _), d in self.output_grads(scalar, retain):
            own, rule = self.layers[module]
            rule(module, own, x.detach(), d.detach(), out)
        return out


def _sq(per_sample: Tensor) -> Tensor:
    """``(batch, ...) -> (batch,)``: each sample's squared norm, float64."""
    return per_sample.reshape(per_sample.shape[0], -1).to(torch.float64).square().sum(1)


def _linear_norms(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, out: Tensor) -> None:
    x, d = tokens(x).to(d.dtype), tokens(d)  # (batch, tokens, in), (batch, tokens, out)
    if "weight" in own:
        out.add_(_sq(linear_rows(d, x)))
    if "bias" in own:
        out.add_(_sq(d.sum(1)))


def _layer_norm_norms(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, out: Tensor) -> None:
    weight, bias = layer_norm_rows(module, x, d)
    if "weight" in own:
        out.add_(_sq(weight))
    if "bias" in own:
        out.add_(_sq(bias))


def _embedding_norms(module: nn.Module, own: dict[str, str], ids: Tensor, d: Tensor, out: Tensor) -> None:
    assert isinstance(module, nn.Embedding)
    keys, per_row = embedding_rows(module, ids, d)
    samples = keys // module.num_embeddings
    out.index_add_(0, samples.cpu(), per_row.to(torch.float64).square().sum(1).cpu())


def _conv_norms(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, out: Tensor) -> None:
    _linear_norms(module, own, *conv_tokens(module, x, d), out)


def _vit_norms(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, out: Tensor) -> None:
    for rows in vit_rows(module, own, d).values():
        out.add_(_sq(rows))


def _lora_norms(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, out: Tensor) -> None:
    """``y = ... + s B (A x)``: ``dB_b = s sum_t d_bt (A x_bt)^T``, ``dA_b = s sum_t (B^T d_bt) x_bt^T``."""
    assert isinstance(module, LoRALinear)
    x, d = tokens(x).to(d.dtype), tokens(d)
    if "lora_B" in own:
        out.add_(_sq(module.scale * linear_rows(d, F.linear(x, module.lora_A.detach()))))
    if "lora_A" in own:
        out.add_(_sq(module.scale * linear_rows(d @ module.lora_B.detach(), x)))


def norms_of(module: nn.Module) -> Norms | None:
    """The rule that adds ``module``'s per-sample squared gradient norms, or ``None`` for a layer it does not cover."""
    if isinstance(module, LoRALinear):
        return _lora_norms
    rule: Norms | None = layer_rule(module, _linear_norms, _layer_norm_norms, _embedding_norms, _conv_norms, _vit_norms)
    return rule


def gradient_noise(seed: int, client: int, task: int, round_: int, kind: str = "sgd") -> NoiseSource:
    """The noise of one client's round (``kind``: ``"sgd"`` its gradients, ``"gram/<phase>"`` its Grams):
    ``seed >= 0`` a generator seeded by all of them (tests and benchmarks), else the operating system's CSPRNG."""
    return keyed_noise(seed, f"dp-{kind}/{seed}/{client}/{task}/{round_}")


def sampling_bits(seed: int, client: int, task: int, round_: int) -> Callable[[int], Tensor]:
    """Uniform ``BITS``-bit integers for the Poisson batches of one client's round: from the operating
    system's CSPRNG (``seed < 0``), since subsampling amplifies privacy only while nobody else can know which records
    a batch holds (the step's public seed must not choose them); ``seed >= 0`` a generator seeded by all four, for
    tests and benchmarks only."""
    if seed < 0:
        return secure_bits
    generator = torch.Generator().manual_seed(derived_seed(f"dp-batches/{seed}/{client}/{task}/{round_}"))
    return lambda count: torch.randint(0, 1 << BITS, (count,), generator=generator, dtype=torch.int64)


def poisson_batches(size: int, noise: TrainingNoise, bits: Callable[[int], Tensor]) -> list[Tensor]:
    """``noise.steps`` batches of positions ``0 .. size - 1``, each position in each batch with probability exactly
    ``noise.sample_rate`` (a multiple of 2^-53: ``common/privacy/training.py``), independently (a record joins when
    its uniform 53-bit integer falls below ``q 2^53``); some may be empty (their step still adds the noise)."""
    below = round(noise.sample_rate * (1 << BITS))
    return [torch.nonzero(bits(size) < below).flatten() for _ in range(noise.steps)]


def private_step(
    params: list[nn.Parameter],
    norms: PerSampleNorms,
    losses: Tensor,
    clip: float,
    sigma: float,
    expected: float,
    source: NoiseSource,
) -> Tensor:
    """Set every parameter's ``.grad`` to DP-SGD's gradient of one batch: ``(sum_b c_b g_b + N(0, sigma^2)) /
    expected``, ``g_b`` the gradient of ``losses[b]`` (a graph recorded by ``norms``), ``c_b = min(1, clip /
    |g_b|)``. Returns the clip factors ``(batch,)``."""
    for p in params:
        p.grad = None
    if losses.numel():
        squared = norms.norms(losses.sum(), retain=True)
        factors = torch.clamp(clip / squared.sqrt().clamp_min(torch.finfo(torch.float64).tiny), max=1.0)
        (losses * factors.to(losses)).sum().backward()
        if unread := norms.unread():  # their gradients took no part in the norms: the clip would not bound them
            raise ValueError(f"DP-SGD: the per-sample norms did not read the layers of {', '.join(unread[:5])}")
    else:
        factors = torch.zeros(0, dtype=torch.float64)
    for p in params:
        noise = source.normal(tuple(p.shape)).mul_(sigma).to(p.device, p.dtype)
        p.grad = noise if p.grad is None else p.grad.add_(noise)
        p.grad.div_(expected)
    return factors


def expected_batch(samples: int, noise: TrainingNoise) -> float:
    """``q n``: the mean batch of a client of ``samples`` records (at least one: the noise is never amplified)."""
    return max(noise.sample_rate * samples, 1.0)
