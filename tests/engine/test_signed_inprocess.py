"""Secure aggregation's signed mode in one process: the engine makes the run a CA and each client a certificate, the
clients sign their keys and check each other's, the coordinator checks each advertise; and the sum unmasked is the
honest mode's, bit for bit (both unmask the same fixed-point sum exactly)."""

from __future__ import annotations

import torch
from test_client_session import CONFIG as SESSION

from engine.simulation import run_inprocess

CONFIG = SESSION.replace(run_id="signed-inprocess", num_clients=4, num_tasks=1)  # four clients, threshold 3


def test_a_signed_run_in_process_signs_and_gives_the_honest_modes_result():
    honest = run_inprocess(CONFIG.replace(settings={"secagg": {"enabled": True}}))
    signed = run_inprocess(CONFIG.replace(settings={"secagg": {"enabled": True, "mode": "signed"}}))
    secure = [h["secagg"] for h in signed.history if "secagg" in h]
    assert secure and all(s["survivors"] == 4 for s in secure)
    # the signed mode's round: every client signed the unmask request (the honest mode has none)
    assert all(s["bytes_received"]["confirm"] > 0 for s in secure)
    assert not any("confirm" in h["secagg"]["bytes_received"] for h in honest.history if "secagg" in h)
    assert signed.matrix.correct == honest.matrix.correct
    for name, factors in honest.adapter.items():
        assert torch.equal(signed.adapter[name].b, factors.b) and torch.equal(signed.adapter[name].a, factors.a)
    assert torch.equal(signed.head_weight, honest.head_weight)
