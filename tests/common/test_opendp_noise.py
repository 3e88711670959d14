"""``dp.sampler opendp``: OpenDP's Gaussian mechanism noises the central release's values, in the same law as the
project's own sampler (Box-Muller on the CSPRNG's uniforms), and only where it serves (central, unseeded).

The laws are compared by Kolmogorov-Smirnov distances against the standard normal, each refused only at the 1e-5
level (the critical distance 2.6 / sqrt(n), Kolmogorov's law: a false failure about once in 400,000 runs): a
sampler off by a tenth in scale, or biased by a tenth of its deviation, fails."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from scipy import stats

from common.privacy.gaussian import OpenDPNoise, SecureNoise, add_noise, calibrate, noise_source, noise_statement
from common.run.config import RunConfig
from common.run.settings import DpSettings
from engine.simulation import run_inprocess

N = 20_000
KOLMOGOROV = 2.6  # P(sqrt(n) D > 2.6) ~ 2.5e-6 for n this large
CRITICAL = KOLMOGOROV / math.sqrt(N)


def ks(sample: torch.Tensor) -> float:
    return float(stats.kstest(sample.numpy(), "norm").statistic)


def test_opendp_and_the_projects_sampler_draw_the_same_law():
    sigma, centre = 3.0, 7.25
    exact = (OpenDPNoise().perturb(torch.full((N,), centre, dtype=torch.float64), sigma) - centre) / sigma
    ours = SecureNoise().normal((N,))
    assert ks(exact) < CRITICAL and ks(ours) < CRITICAL
    assert float(stats.ks_2samp(exact.numpy(), ours.numpy()).statistic) < CRITICAL * math.sqrt(2)
    assert ks(exact * 1.1) > CRITICAL and ks(exact + 0.1) > CRITICAL  # it sees a 10 % scale, a 0.1 sigma bias


def test_a_gram_gets_the_same_symmetric_noise_through_opendp():
    """Diagonal deviation sigma, each pair above it once with sigma / sqrt(2), mirrored; the class sums sigma."""
    d, sigma = 160, 2.0
    settings = DpSettings(epsilon=1.0, sampler="opendp")
    calibrated = calibrate(settings, ("gram", "class_sum"))
    scale = sigma / calibrated["gram"].sigma  # the Gram's at deviation sigma: the law, not the budget, is tested
    releases = {name: dataclasses.replace(r, sigma=r.sigma * scale) for name, r in calibrated.items()}
    gram, sums = torch.eye(d, dtype=torch.float64), torch.zeros(30, 64, dtype=torch.float64)
    add_noise({"gram": gram, "class_sum": sums}, releases, noise_source(-1, 0, "opendp"))
    assert torch.equal(gram, gram.T)
    rows, cols = torch.triu_indices(d, d, 1)
    assert ks((gram.diagonal() - 1.0) / sigma) < KOLMOGOROV / math.sqrt(d)
    assert ks(gram[rows, cols] / (sigma / math.sqrt(2.0))) < KOLMOGOROV / math.sqrt(len(rows))
    assert ks(sums.flatten() / releases["class_sum"].sigma) < KOLMOGOROV / math.sqrt(sums.numel())
    assert noise_statement(-1, "opendp") == "opendp"


def test_opendp_serves_the_central_unseeded_release_only():
    assert DpSettings(epsilon=1.0, sampler="opendp").sampler == "opendp"
    for bad in ({"seed": 0}, {"mode": "local"}, {"mode": "client"}):
        with pytest.raises(ValueError, match="dp.sampler = opendp serves dp.mode central"):
            DpSettings(epsilon=1.0, sampler="opendp", **bad)
    with pytest.raises(ValueError, match="dp.sampler must be one of"):
        DpSettings(epsilon=1.0, sampler="gauss")


def test_a_central_run_releases_through_opendp_and_says_so(tmp_path):
    config = RunConfig(
        method="ncm",
        num_clients=2,
        num_tasks=2,
        threads=1,
        backbone="tiny-bert",
        extra={"synthetic_classes": 4, "synthetic_train": 24, "synthetic_test": 4},
        settings={"dp": {"epsilon": 4.0, "sampler": "opendp"}},
    )
    run_inprocess(config, results_dir=tmp_path)
    privacy = json.loads((tmp_path / "metrics.json").read_text())["privacy"]
    assert privacy["noise"] == "opendp" and privacy["epsilon"] <= 4.0 and len(privacy["steps"]) == 2
