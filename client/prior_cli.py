"""``lorm-prior``: a run's public prior, encoded once by the run's own backbone and feature map, for every party.

A private head's features can pass a public prior first (``common/privacy/public_prior.py``): the centre and the
whitened top-``k`` basis of public text's features, so that a class sum's noise falls on ``k`` coordinates instead of
``F``. This program reads the public corpus from its package (no download), encodes it as every client of the run
encodes its records (the configured backbone, ``max_length``, the head's ``layers``, ``pool`` and ``norm``: the
features before the random projection and the clip), fits the prior, writes it with the statement of what it was
fitted on, and prints the settings that name it in the run: ``prior_digest`` and ``prior_k``, which the clients
receive and hold the plans' prior to, and ``prior_file``, the coordinator's copy. The clients never read the file:
the coordinator sends its tensors in each features step and evaluation.

Choose the corpus's size, ``k`` and the shrinkage before any private record is seen, or on held-out training
samples only (``bench/dp_ridge.py --choose`` on CLINC150's val split: 50,000 utterances, k 128, shrink 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from client.classifier import build_model, reads_text
from client.datasets import load_dataset
from client.features import FEATURE_BATCH, backbone_features
from client.runtime import chosen_max_length
from common.aggregation.declared import feature_stats_of
from common.methods import method
from common.methods.checks import validate
from common.methods.closed_form import NcmSettings
from common.privacy.public_prior import CORPORA, DTYPE, fit_prior, load_corpus, write_prior
from common.run.arguments import add_config_arguments, config_from_args
from common.run.config import RunConfig
from common.run.settings import DataSettings


@torch.no_grad()
def public_features(config: RunConfig, texts: list[str]) -> torch.Tensor:
    """``(n, F)`` float64: ``texts`` through the run's backbone (``W0``, eval mode) and its head's layers, pool and
    norm, as a client's features step computes them before the projection."""
    model = build_model(config, 1)  # the head is not read: the backbone's features only
    if not reads_text(model):
        raise ValueError(f"a public prior of text needs a text backbone; the run's is {type(model.backbone).__name__}")
    model.eval()
    mapped = feature_stats_of(config).features
    rows = []
    for start in range(0, len(texts), FEATURE_BATCH):
        inputs = model.backbone.encode(texts[start : start + FEATURE_BATCH])
        rows.append(backbone_features(model, inputs, mapped).to(DTYPE).cpu())
    return torch.cat(rows)


def fixed_length(config: RunConfig) -> RunConfig:
    """``config`` with the tokens a sentence keeps fixed as its clients fix them (``max_length`` 0: the training
    split's 99th percentile, which needs the run's dataset)."""
    if config.max_length:
        return config
    if config.section(DataSettings).owned:
        raise ValueError("max_length 0 with the clients' own data: the run must fix max_length")
    return dataclasses.replace(config, max_length=chosen_max_length(config, load_dataset(config))[0])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-prior",
        description="Encode a public corpus with a run's backbone and feature map and write its public prior.",
    )
    add_config_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="the prior's file (safetensors)")
    parser.add_argument("--corpus", default="chitchat", choices=CORPORA, help="the public corpus (a package's)")
    parser.add_argument("--size", type=int, default=50_000, help="utterances encoded")
    parser.add_argument("--k", type=int, default=128, help="whitened directions kept: the head's input width")
    parser.add_argument("--shrink", type=float, default=1.0, help="each eigenvalue plus shrink x their mean")
    parser.add_argument("--corpus-seed", type=int, default=0, help="the corpus's shuffle (which utterances)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = fixed_length(validate(config_from_args(args)))
        own = config.section(feature_stats_settings(config))
        corpus = load_corpus(args.corpus, args.size, args.corpus_seed)
    except (OSError, ValueError, ModuleNotFoundError) as err:
        parser.error(str(err))
    if config.threads:
        torch.set_num_threads(config.threads)
    start = time.perf_counter()
    features = public_features(config, list(corpus.texts))
    encoded = time.perf_counter() - start
    try:
        prior = fit_prior(features, args.k, args.shrink)
    except ValueError as err:
        parser.error(str(err))
    statement = corpus.statement() | {
        "k": args.k,
        "backbone": config.backbone or "default",
        "max_length": config.max_length,
        "features": {"layers": list(own.layers), "pool": own.pool, "norm": own.norm},
    }
    digest = write_prior(args.out, prior, statement)
    section = own.section
    print(
        json.dumps(
            {
                "wrote": str(args.out),
                "encoded": len(corpus.texts),
                "seconds": round(encoded, 1),
                "bytes": args.out.stat().st_size,
                "digest": digest,
                "set": [f"{section}.prior_digest={digest}", f"{section}.prior_k={args.k}"],
                "coordinator": f"{section}.prior_file={args.out}",
            }
        ),
        flush=True,
    )
    return 0


def feature_stats_settings(config: RunConfig) -> type[NcmSettings]:
    """The run's closed-form head's settings class (``ncm`` or ``ridge``): ``ValueError`` for another method."""
    own = method(config.method).settings
    if own is None or not issubclass(own, NcmSettings):
        raise ValueError(f"a public prior is for the closed-form heads ncm and ridge, not {config.method!r}")
    return own


if __name__ == "__main__":
    raise SystemExit(main())
