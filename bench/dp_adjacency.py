"""What the noise the published DP cells ran with gives under the replace-one adjacency, and the noise that replaces it.

Until the calibration was restated under replace-one (one record replaced by another of the same label; counts and
labels public), every mechanism was calibrated for add-or-remove sensitivities: ``C`` for a class sum, ``C^2`` for a
Gram, ``S`` for a client's change, DP-SGD's subsampled Gaussian under an add-or-remove RDP accountant. Exact counts
were released beside them, under which add-or-remove holds no epsilon at all; replace-one does, and this prints it for
the noise those cells used, beside the noise the same budget calls for now (``calibrate``, ``training_noise``,
``ClientLevelNoise.of``). Distributed mode's sums carry the central Gaussian's variance scaled by ``s`` a little above
1; their epsilon is at most the central mechanism's at the same variance, printed for the central mode.

Run: .venv/bin/python bench/dp_adjacency.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import dp_accounting  # noqa: E402
from dp_accounting.rdp import RdpAccountant  # noqa: E402

from common.privacy.gaussian import GRAM_REPLACE, SUM_REPLACE, gaussian_epsilon, gaussian_mu  # noqa: E402
from common.privacy.training import TrainingNoise, pld_epsilon, training_noise  # noqa: E402
from common.run.settings import DpSettings  # noqa: E402

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
# the RDP orders the add-or-remove calibration used
ORDERS = (1.75, *(2 + k / 4 for k in range(40)), *range(12, 65), 128, 256, 512)


def central(epsilon: float, gram_share: float | None) -> float:
    """Replace-one epsilon of the old central calibration: class sums at C / mu_S, the Gram (ridge) at C^2 / mu_G."""
    mu = gaussian_mu(epsilon, DELTA)
    if gram_share is None:  # NCM: the class sums take the whole budget
        return gaussian_epsilon(SUM_REPLACE * mu, DELTA)
    shares = gram_share * GRAM_REPLACE**2 + (1 - gram_share) * SUM_REPLACE**2
    return gaussian_epsilon(mu * math.sqrt(shares), DELTA)


def old_dpsgd(settings: DpSettings, epochs: int, rounds: int, grams: bool) -> TrainingNoise:
    """The add-or-remove calibration the published LoRM and FedAvg-LoRA cells ran with (RDP accountant)."""
    q = settings.sample_rate
    steps = math.ceil(epochs / q)
    releases = rounds + 1 if grams else 0
    z_gram = math.sqrt(releases) / (math.sqrt(settings.gram_share) * gaussian_mu(settings.epsilon, settings.delta))

    def event(z: float) -> dp_accounting.DpEvent:
        sgd = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
        parts = [dp_accounting.SelfComposedDpEvent(sgd, steps * rounds)]
        if releases:
            parts.append(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z_gram), releases))
        return dp_accounting.ComposedDpEvent(parts)

    z = dp_accounting.calibrate_dp_mechanism(
        lambda: RdpAccountant(ORDERS),
        event,
        settings.epsilon,
        settings.delta,
        dp_accounting.mechanism_calibration.ExplicitBracketInterval(1e-2, 1e4),
        tol=1e-4,
    )
    return TrainingNoise(q, steps, float(z), z_gram if releases else 0.0, rounds, releases)


def main() -> int:
    print("central closed-form heads (ridge: dp.gram_share 0.1; ncm): replace-one epsilon of the old noise")
    print("| stated epsilon | ridge | ncm | client level (DP-FedAvg) |")
    print("|---|---|---|---|")
    for e in EPSILONS:
        # client level: each round's sum moved by S under add-or-remove, 2 S when a client's data is replaced
        client = gaussian_epsilon(SUM_REPLACE * gaussian_mu(e, DELTA), DELTA)
        print(f"| {e:g} | {central(e, 0.1):.2f} | {central(e, None):.2f} | {client:.2f} |")
    print()
    print("DP-SGD, LoRM's defaults (5 rounds of 1 epoch, q 0.05, Grams) and FedAvg-LoRA's (no Grams)")
    print("| stated epsilon | method | old z (z_G) | replace-one epsilon of the old noise | new z (z_G) |")
    print("|---|---|---|---|---|")
    for e in EPSILONS:
        settings = DpSettings(epsilon=e, delta=DELTA, mode="local", sample_rate=0.05)
        for name, grams in (("lorm", True), ("fedavg-lora", False)):
            old = old_dpsgd(settings, 1, 5, grams)
            new = training_noise(settings, 1, 5, grams)
            # the old Gram multiplier read at the replace-one distance: the event of multiplier sqrt(2) z_G there
            true = pld_epsilon(old.event(5, old.grams), DELTA)
            gram = f" ({old.gram_multiplier:.2f})" if grams else ""
            new_gram = f" ({new.gram_multiplier:.2f})" if grams else ""
            old_z, new_z = f"{old.noise_multiplier:.3f}{gram}", f"{new.noise_multiplier:.3f}{new_gram}"
            print(f"| {e:g} | {name} | {old_z} | {true:.2f} | {new_z} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
