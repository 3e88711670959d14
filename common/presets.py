"""Named run configurations. Any value can still be overridden (``--set KEY=VALUE``)."""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # The embedded default: CLINC150 with the pretrained all-MiniLM-L6-v2 (offline, from PyPI),
    # the paper's 5 tasks x 30 intents and LoRM's OOS settings (lr 1e-2, rank 1, head gamma 0.5),
    # cut down (10 training and 10 test utterances per intent, 3 clients, 3 rounds of 1 epoch)
    # so that coordinator and clients finish in a few minutes on 2 CPU cores.
    "demo": dict(run_id="demo", dataset="clinc150", backbone="minilm", num_tasks=5, num_clients=3, beta=0.5,
                 train_per_class=10, test_per_class=10, min_client_samples=6, rounds_per_task=3, local_epochs=1,
                 batch_size=16, lr=1e-2, rank=1, gamma_backbone=0.0, gamma_head=0.5, max_length=32, threads=1),
    # A random-init tiny BERT on synthetic text: seconds, for smoke tests.
    "tiny": dict(run_id="tiny", dataset="synthetic-text", backbone="tiny-bert", num_tasks=3, num_clients=3,
                 rounds_per_task=3, local_epochs=3, rank=2, lr=3e-2, lr_lora=1e-3, threads=1,
                 extra={"synthetic_classes": 9, "synthetic_train": 40, "synthetic_test": 10}),
}


def preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return dict(PRESETS[name])
