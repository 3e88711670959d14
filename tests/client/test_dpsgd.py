"""DP-SGD's per-sample machinery (client/dpsgd.py) against a backward pass per sample: each sample's gradient norm,
the clipped sum, the clip's bound on one record's effect, and the noise."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from test_persample import TEXTS
from torch import nn

from client.backbone_builders import build_backbone
from client.classifier import ClassifierModel
from client.dpsgd import PerSampleNorms, gradient_noise, private_step
from common.adapters.lora import GramRecorder
from common.run.config import RunConfig

from tolerance import rel_tolerance

LABELS = torch.tensor([0, 3, 5, 1, 3])


def model_with(trained: str, backbone: str = "tiny-bert") -> tuple[ClassifierModel, dict[str, nn.Parameter]]:
    """``backbone`` with rank-2 LoRA and a 7-class head, in eval mode (no dropout: the loop and the batch see one
    function); ``trained``: "lora" (both factors, the head) or "dense" (every backbone weight, the head)."""
    torch.manual_seed(0)
    model = ClassifierModel(build_backbone(RunConfig(backbone=backbone, max_length=32)), 7, 2).eval()
    with torch.no_grad():
        for layer in model.lora().values():
            layer.lora_B.normal_(0, 0.1)  # B = 0 would make A's gradient 0
    for p in model.parameters():
        p.requires_grad_(False)
    params = {
        n: p for n, p in model.named_parameters() if (".lora_" in n) == (trained == "lora") or n.startswith("head.")
    }
    for p in params.values():
        p.requires_grad_(True)
    return model, params


def losses_of(model: ClassifierModel, inputs: dict[str, torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(inputs)[0], labels, reduction="none")


def per_sample_grads(model, params, inputs) -> list[dict[str, torch.Tensor]]:
    out = []
    for b in range(len(LABELS)):
        one = {k: v[b : b + 1] for k, v in inputs.items()}
        grads = torch.autograd.grad(losses_of(model, one, LABELS[b : b + 1]).sum(), list(params.values()))
        out.append({n: g.double() for n, g in zip(params, grads)})
    return out


def flat_norm(grads: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(g.square().sum()) for g in grads.values()))


@pytest.mark.parametrize("backbone", ["tiny-bert", "tiny-vit"])
@pytest.mark.parametrize("trained", ["lora", "dense"])
def test_each_samples_norm_is_its_own_backward_pass(trained, backbone):
    """LoRA factors (and the head), or every backbone weight (linear, layer norm, embeddings; a ViT's patch
    embedding's convolution, class token and position embedding): the batched norms equal the norms of one
    backward pass per sample, to float32 rounding of sums over the batch and the tokens."""
    model, params = model_with(trained, backbone)
    torch.manual_seed(4)
    texts = backbone == "tiny-bert"
    inputs = model.backbone.tokenize(TEXTS) if texts else {"pixel_values": torch.randn(len(LABELS), 3, 16, 16)}
    norms = PerSampleNorms(model, params)
    with norms.recording(len(LABELS)):
        losses = losses_of(model, inputs, LABELS)
    got = norms.norms(losses.sum()).sqrt()
    want = torch.tensor([flat_norm(g) for g in per_sample_grads(model, params, inputs)], dtype=torch.float64)
    assert float(want.min()) > 0
    tol = rel_tolerance(torch.float32, terms=32 * len(TEXTS), safety=64)
    torch.testing.assert_close(got, want, rtol=tol, atol=0.0)


def test_the_step_is_the_clipped_sum_and_one_record_moves_it_by_at_most_the_clip():
    """No noise: the step's gradient times the expected batch is ``sum_b min(1, C / |g_b|) g_b`` of the per-sample
    passes; removing any one sample, however large its gradient, moves that sum by at most ``C``."""
    model, params = model_with("lora")
    inputs = model.backbone.tokenize(TEXTS)
    grads = per_sample_grads(model, params, inputs)
    clip = 0.5 * min(flat_norm(g) for g in grads)  # every sample is clipped
    norms = PerSampleNorms(model, params)
    with norms.recording(len(TEXTS)):
        losses = losses_of(model, inputs, LABELS)
    factors = private_step(list(params.values()), norms, losses, clip, 0.0, 2.5, gradient_noise(0, 0, 0, 0))
    want = {n: sum(min(1.0, clip / flat_norm(g)) * g[n] for g in grads) for n in params}
    tol = rel_tolerance(torch.float32, terms=32 * len(TEXTS), safety=64)
    for n, p in params.items():
        assert p.grad is not None
        torch.testing.assert_close(p.grad.double() * 2.5, want[n], rtol=tol, atol=tol * float(want[n].abs().max()))
    assert bool((factors < 1).all())
    for b, g in enumerate(grads):  # the neighbour without sample b
        contribution = math.sqrt(sum(float((factors[b] * g[n]).square().sum()) for n in params))
        assert contribution <= clip * (1 + tol)


def test_a_step_adds_the_noise_of_its_source_and_an_empty_batch_only_noise():
    """An empty Poisson batch still steps: its gradient is the source's draws times sigma over the expected batch."""
    model, params = model_with("lora")
    norms = PerSampleNorms(model, params)
    private_step(list(params.values()), norms, torch.zeros(0), 1.0, 3.0, 4.0, gradient_noise(9, 1, 2, 3))
    source = gradient_noise(9, 1, 2, 3)
    for p in params.values():
        assert p.grad is not None
        torch.testing.assert_close(p.grad, (source.normal(tuple(p.shape)) * 3.0 / 4.0).float())
    other = gradient_noise(9, 1, 2, 4)  # another round: other draws
    p = next(iter(params.values()))
    assert not torch.equal(p.grad, (other.normal(tuple(p.shape)) * 3.0 / 4.0).float())


def test_the_gram_energy_clip_bounds_what_one_sample_moves():
    """With ``energy_clip`` c, adding a sample of any size to a batch moves each module's Gram (full or diagonal, a
    token layer or the head's one row) by at most c in Frobenius norm, and samples within it are left as they are."""
    model, _ = model_with("lora")
    inputs = model.backbone.tokenize(TEXTS)
    name, layer = next(iter(model.lora().items()))
    modules = {name: layer, "<head>": model.head, "diag": list(model.lora().values())[1]}
    full = {name: True, "<head>": True, "diag": False}

    def grams(rows: slice, clip: float | None) -> dict[str, torch.Tensor]:
        recorder = GramRecorder(modules, full, energy_clip=clip)
        batch = {k: v[rows] for k, v in inputs.items()}
        recorder.row_mask = batch["attention_mask"]
        with torch.no_grad(), recorder.recording():
            model(batch)
        return recorder.result()

    clip = 3.0
    without, with_all = grams(slice(0, 4), clip), grams(slice(0, 5), clip)
    unclipped = grams(slice(0, 5), None)[name] - grams(slice(0, 4), None)[name]
    assert float(unclipped.norm()) > 10 * clip  # the fifth sample is far beyond the clip
    for key in modules:
        moved = float((with_all[key] - without[key]).norm())
        assert 0 < moved <= clip * (1 + rel_tolerance(torch.float64, terms=64))
    roomy = 1e12  # no sample reaches it: the Grams as without a clip
    for key, gram in grams(slice(0, 5), roomy).items():
        torch.testing.assert_close(gram, grams(slice(0, 5), None)[key])


def test_the_gram_noise_covers_every_pass_over_the_shard():
    """With gram_passes = P a sample is recorded P times (each with its own augmentation): its Grams move by P times
    the clip, and the noise (and the lambda added to a full Gram) is P times as large, from the same draws."""
    from types import SimpleNamespace

    from client.ledger import ClientLedger
    from client.methods.lora import noise_grams
    from common.wire.instructions import GramKind, LoraStep
    from common.wire.messages import Phase, RoundPlan

    plan = RoundPlan(
        run_id="r",
        phase=Phase.TRAIN,
        task=0,
        round=0,
        class_range=(0, 2),
        seen_classes=2,
        instruction=LoraStep(gram=GramKind.FULL),
        tensors={},
        seed=1,
    )
    noised = []
    for passes in (1, 2):
        config = RunConfig(gram_passes=passes, settings={"dp": {"epsilon": 8.0, "mode": "local", "seed": 4}})
        grams = {"a": torch.zeros(3, 3, dtype=torch.float64), "b": torch.zeros(3, 3, dtype=torch.float64)}
        noise_grams(SimpleNamespace(config=config, index=0, ledger=ClientLedger(config)), plan, grams)
        noised.append(grams)
    for name in ("a", "b"):
        assert float(noised[0][name].abs().max()) > 0
        torch.testing.assert_close(noised[1][name], 2 * noised[0][name], rtol=rel_tolerance(torch.float64), atol=0.0)


def test_the_batches_are_secret_and_each_record_joins_with_probability_q():
    """Subsampling amplifies privacy only if nobody can know which records a batch holds: without dp.seed the batches
    come from the OS's CSPRNG (two draws of the same round differ), never from the step's public seed; with one they
    are reproducible (tests, benchmarks). Each record joins each batch with probability q: over 400 steps of 500
    records the count lies within 5 standard deviations of q n steps (q 2x off fails by far)."""
    from client.dpsgd import poisson_batches, sampling_bits
    from common.privacy.training import training_noise
    from common.run.settings import DpSettings

    noise = training_noise(DpSettings(epsilon=8.0, mode="local", sample_rate=0.1), 40, 1, False)
    assert noise.steps == 400
    secret = [poisson_batches(500, noise, sampling_bits(-1, 0, 0, 0)) for _ in range(2)]
    assert any(not torch.equal(a, b) for a, b in zip(*secret))
    seeded = [poisson_batches(500, noise, sampling_bits(7, 0, 0, 0)) for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip(*seeded))
    for batches in (secret[0], seeded[0]):
        joined = sum(b.numel() for b in batches)
        mean, sd = 0.1 * 500 * 400, math.sqrt(0.1 * 0.9 * 500 * 400)
        assert abs(joined - mean) < 5 * sd


class AroundTheHook(nn.Module):
    """A covered layer used only functionally (``F.linear`` on its weight): its hook never fires, its parameters
    still get gradients, so their per-sample norms would count as 0."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(4, 3), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.linear(x, self.lin.weight, self.lin.bias))


def test_a_gradient_the_norms_did_not_read_is_refused_not_left_unclipped():
    """The attack on the clip: a parameter whose gradient flows partly around its layer's hook has a per-sample norm
    smaller than its gradient's, so the clip would not bound one record's effect. The step refuses it."""
    torch.manual_seed(5)
    model = AroundTheHook()
    params = dict(model.named_parameters())
    norms = PerSampleNorms(model, params)
    with norms.recording(3):
        losses = model(torch.randn(3, 4)).square().sum(1)
    with pytest.raises(ValueError, match="did not read the layers of lin.weight, lin.bias"):
        private_step(list(params.values()), norms, losses, 1.0, 0.0, 3.0, gradient_noise(0, 0, 0, 0))
