"""The privacy-utility curve of the closed-form heads on CLINC150: accuracy at each epsilon, by the
system's own strategy code on cached frozen features.

all-MiniLM-L6-v2's pooled hidden states (``bench/feature_heads.py``'s cache), the system's ``ridge.layers [-3, -2,
-1]`` with ``norm layer`` (three layer-normalised layers side by side, F' = 1,152, every sample of norm
sqrt(1,152)); the paper's 5 tasks x 30 intents in alphabetical order, the train split (15,000 utterances). Each
task's statistics go through the coordinator's ``RidgeHead`` (or ``NearestClassMean``) exactly as a run's features
step: one update per task (sums do not care how the samples were split, so the head is the one of every beta and
every number of clients), ``dp.clip`` applied by the client's ``feature_map``, the noise, the ledger and the
noise-floor lambda by ``server/strategies/closed_form.py``. epsilon ``inf`` is the run without a dp section
(lambda by the held-out rule). The printed accuracy is over the 150 intents after the last task (the FAA: the
five tasks' test sets are equal); ``--split val`` scores CLINC150's val split instead, for choosing settings
without the test split.

``--cell NAME`` takes the head instead from a cell of ``--method-config`` (``bench/clinc150_methods.json``): its
backbone (``mpnet``: all-mpnet-base-v2, cached by ``bench/feature_heads.py --encoder mpnet``), its ``ridge`` settings
(layers, norm, ``rp_dim``, ``blocks``; lambda's grid and rule without a budget) and its ``data.train_val`` (CLINC150's
val split joins the training set after the train split, as ``client/text_datasets.py`` does; the test split is scored).
With a budget the strategy sends no held-out statistics and takes lambda from the noise, as it does in a run.

``--prior chitchat`` puts a public prior before the clip (``common/privacy/public_prior.py``): ``--prior-size``
utterances of chitchat-dataset, encoded by the same encoder, layers and norm (cached by their digest), give the centre
and the ``--prior-k`` whitened directions of their covariance (``--prior-shrink``); every record's features become
``(x - m) W`` and the head is fitted on those ``k`` coordinates. ``--choose`` picks the prior's ``k``, shrinkage and
size on CLINC150's val split alone (held-out training samples: the test split is not loaded) at the first of
``--epsilons``, by the mean accuracy over ``--choose-seeds`` noise seeds, and prints the choice.

Run: .venv/bin/python bench/dp_ridge.py --epsilons 0.5 1 2 4 8 inf --seed 0
     .venv/bin/python bench/dp_ridge.py --cell ridge@mpnet-6layers+valx4avg --by-length --epsilons 8 --seed 0
     .venv/bin/python bench/dp_ridge.py --method ncm --encoder mpnet --layers -6 -5 -4 -3 -2 -1 --prior chitchat ...
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.feature_heads import cached_features, encoder_tag, load_clinc, pooled_states  # noqa: E402
from client.features import feature_map, normalise_layers, random_projection  # noqa: E402
from client.features import sums as client_sums  # noqa: E402
from common.aggregation.declared import HOLDOUT, FeatureStats  # noqa: E402
from common.privacy.gaussian import CLASS_SUM, GRAM, add_noise, calibrate, noise_source  # noqa: E402
from common.privacy.public_prior import PublicPrior, fit_prior, load_corpus, write_prior  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.run.settings import DpSettings  # noqa: E402
from common.wire.messages import ClientUpdate, ModelSpec, Phase  # noqa: E402
from common.wire.tensors import pack  # noqa: E402
from server.strategies import make_strategy  # noqa: E402
from server.strategies.closed_form import ClosedFormHead  # noqa: E402

LAYERS = [-3, -2, -1]  # the last three of MiniLM's seven hidden states: ridge.layers [-3, -2, -1]
CLASSES, TASKS = 150, 5


def head_of(args: argparse.Namespace) -> tuple[str, dict]:
    """The encoder and the method's settings: ``--cell``'s from ``--method-config``, else ``--encoder``'s
    ``--layers`` (MiniLM's three by default; ``--rp-dim``)."""
    if not args.cell:
        return args.encoder, {args.method: {"layers": args.layers, "norm": "layer", "rp_dim": args.rp_dim}}
    if args.encoder != "minilm" or args.layers != LAYERS:
        raise SystemExit("--cell names its own encoder and layers: not with --encoder or --layers")
    cells = json.loads(args.method_config.read_text())
    if args.cell not in cells:
        raise SystemExit(f"--cell {args.cell!r}: not a cell of {args.method_config} ({sorted(cells)})")
    cell = cells[args.cell]
    method = args.cell.split("@")[0]
    if method != args.method:
        raise SystemExit(f"--cell {args.cell!r} is a {method} head: pass --method {method}")
    return cell.get("backbone", "minilm"), copy.deepcopy(cell["settings"])


def features(states: dict, split: str, layers: list[int], norm: str) -> torch.Tensor:
    """``(n, F)``: the ``layers``' mean-pooled states (each layer-normalised with ``norm layer``), side by side."""
    x = torch.from_numpy(states[split]["mean"][:, layers]).to(torch.float64)
    return (normalise_layers(x) if norm == "layer" else x).flatten(1)


def public_features(args: argparse.Namespace, encoder: str, head: dict) -> torch.Tensor:
    """``(n, F)``: the largest ``--prior-size`` of the public corpus through the encoder, the head's layers and norm
    (pooled once per corpus digest into ``--cache``); a smaller size is its first rows (the corpus's order is
    fixed by its seed)."""
    corpus = load_corpus(args.prior, max(args.prior_size), args.prior_seed)
    file = args.cache / f"public-{args.prior}-{encoder_tag(encoder)}-{corpus.digest[:16]}.npz"
    if not file.exists():
        start = time.perf_counter()
        states = pooled_states(list(corpus.texts), 64, encoder=encoder, by_length=args.by_length)
        args.cache.mkdir(parents=True, exist_ok=True)
        np.savez(file, mean=states["mean"])
        seconds = time.perf_counter() - start
        print(json.dumps({"encoded": len(corpus.texts), "encoder": encoder, "seconds": round(seconds, 1)}), flush=True)
    with np.load(file) as f:
        return features({"public": {"mean": f["mean"]}}, "public", head["layers"], head["norm"])


def prior_statement(args: argparse.Namespace, size: int, k: int, shrink: float) -> dict:
    """What a row says of its prior: the corpus (name, size, seed, digest of the texts) and the basis's k and
    shrinkage."""
    return load_corpus(args.prior, size, args.prior_seed).statement() | {"k": k, "shrink": shrink}


def choose_prior(args: argparse.Namespace, head: tuple[dict, int], x: dict, y: dict, public: torch.Tensor) -> dict:
    """The prior's size, k and shrinkage of the best mean val accuracy over ``--choose-seeds`` at the first of
    ``--epsilons`` (ties: the first in the grid's order, smaller sizes and k first); every candidate printed."""
    epsilon, best = args.epsilons[0], None
    for size in sorted(args.prior_size):
        for k in sorted(args.prior_k):
            for shrink in sorted(args.prior_shrink):
                xs, settings = with_prior(x, fit_prior(public[:size], k, shrink), head[0], args.method)
                scores = []
                for seed in args.choose_seeds:
                    trial = argparse.Namespace(**vars(args) | {"seed": seed, "split": "val"})
                    scores.append(run(args.method, epsilon, trial, (settings, k), xs, y)[0])
                row = {"size": size, "k": k, "shrink": shrink, "epsilon": epsilon, "val": sum(scores) / len(scores)}
                print(json.dumps(row | {"val_seeds": scores}), flush=True)
                if best is None or row["val"] > best["val"]:
                    best = row
    assert best is not None
    print(json.dumps({"chosen": best}), flush=True)
    return best


def with_prior(x: dict, prior: PublicPrior, settings: dict, method: str) -> tuple[dict, dict]:
    """The features after ``prior`` (``(n, k)``), and the method's settings for them: the head reads the ``k``
    coordinates as its backbone's own features (no layers, no norm: the prior's input had both)."""
    settings = copy.deepcopy(settings)
    settings[method] |= {"layers": [], "norm": "none"}
    return {split: prior.apply(rows) for split, rows in x.items()}, settings


def statistics(
    x: torch.Tensor,
    labels: torch.Tensor,
    index: torch.Tensor,
    classes: tuple[int, int],
    gram: bool,
    stats_of: FeatureStats,
) -> dict[str, torch.Tensor]:
    """What a client sends for the rows ``x`` (global training indices ``index``) of the task's ``classes``, by
    ``client/features.py``'s ``sums`` and hold-out rule: the class sums and counts, with ``gram`` the Gram's
    factor (its ``blocks``), and with the held-out rule the held-out rows' alike."""
    stats = client_sums(x, labels, classes, gram, stats_of.moments, stats_of.blocks)
    if gram and stats_of.holdout:
        held = index % stats_of.holdout == 0
        held_stats = client_sums(x[held], labels[held], classes, gram, blocks=stats_of.holdout_blocks)
        stats |= {HOLDOUT + name: t for name, t in held_stats.items()}
    return stats


def run(
    method: str, epsilon: float, args: argparse.Namespace, head: tuple[dict, int], x: dict, y: dict
) -> tuple[float, float | None, float | None]:
    """Accuracy (%) on ``args.split`` of the head after the five tasks, its lambda and the run's epsilon; ``head``:
    the run's settings without ``dp`` and the encoder's hidden width."""
    settings, hidden = copy.deepcopy(head[0]), head[1]
    if math.isfinite(epsilon):
        settings["dp"] = {
            "epsilon": epsilon,
            "delta": args.delta,
            "clip": args.clip,
            "gram_share": args.gram_share,
            "lambda_scale": args.lambda_scale,
            "seed": args.seed,
        }
    config = RunConfig(method=method, dataset="clinc150", num_tasks=TASKS, seed=args.seed, settings=settings)
    strategy = make_strategy(config, ModelSpec(layers={}, feature_dim=hidden, num_classes=CLASSES))
    assert isinstance(strategy, ClosedFormHead)
    stats_of = strategy.settings.feature_stats(config)  # clip, blocks, and the held-out rule without a budget
    projection = random_projection(config, strategy.settings.feature_width(hidden))  # the clients' seeded P, or None

    def mapped(rows: torch.Tensor) -> torch.Tensor:  # (n, F'): what the clients' feature_map gives
        wanted = stats_of.features
        return feature_map(rows, projection, wanted.activation, wanted.clip, wanted.clip_blocks)

    last = len(strategy.tasks) - 1
    for task, classes in enumerate(strategy.tasks):
        strategy.begin_task(task)
        plan = strategy.configure(task, 0, Phase.FEATURES)
        fold = strategy.fold(plan)
        rows = torch.nonzero((y["train"] >= classes[0]) & (y["train"] < classes[1])).squeeze(1)  # global indices
        train = mapped(x["train"][rows])
        stats = statistics(train, y["train"][rows], rows, classes, strategy.use_gram, stats_of)
        del train
        update = ClientUpdate.of_step(plan, 0, "c0", len(rows), pack(stats=stats))
        del stats
        fold.aggregator.fold(update)
        del update
        # only the last task's head is scored: the earlier heads' solves (a function of the totals alone, which
        # the last solve reads whole) are skipped, the step's release, ledger and totals are the run's
        skip = mock.patch.object(strategy, "solve", return_value=strategy.head_w)
        with skip if task < last else contextlib.nullcontext():
            fold.finish()
        del fold
    report = strategy.step_report(plan)
    scores = mapped(x[args.split]) @ strategy.head_w.T
    accuracy = float((scores.argmax(1) == y[args.split]).double().mean()) * 100
    return accuracy, report.get("ridge_lambda"), report.get("dp", {}).get("run_epsilon")


def diagnose(epsilon: float, args: argparse.Namespace, x: dict, y: dict) -> dict[str, float]:
    """Which noise costs what (val split, lambda best on val from a grid: a diagnostic, not a private figure): the
    ridge head of the five tasks' statistics with the Gram's noise only, the class sums' only, and both, each drawn
    as the run draws it (``dp.clip`` 1 on features of norm sqrt(1,152): all scaled to unit norm; five Gram
    releases summed, each class's sums noised once)."""
    dp = DpSettings(epsilon=epsilon, delta=args.delta, clip=1.0, gram_share=args.gram_share)
    releases = calibrate(dp, (GRAM, CLASS_SUM))
    train = feature_map(x["train"], None, clip=1.0)
    one_hot = torch.nn.functional.one_hot(y["train"], CLASSES).to(torch.float64)
    exact = {GRAM: train.T @ train, CLASS_SUM: one_hot.T @ train}
    noisy = {name: t.clone() for name, t in exact.items()}
    for task in range(TASKS):  # the run's draws: one per task, the task's rows of the class sums
        source = noise_source(args.seed, task)
        rows = slice(task * CLASSES // TASKS, (task + 1) * CLASSES // TASKS)
        add_noise({CLASS_SUM: noisy[CLASS_SUM][rows], GRAM: noisy[GRAM]}, releases, source)
    val = feature_map(x["val"], None, clip=1.0)
    grid = tuple(10.0 ** (k / 4) for k in range(-4, 18))
    out = {}
    for name, (gram, sums) in {
        "gram noise only": (noisy[GRAM], exact[CLASS_SUM]),
        "class-sum noise only": (exact[GRAM], noisy[CLASS_SUM]),
        "both": (noisy[GRAM], noisy[CLASS_SUM]),
        "neither": (exact[GRAM], exact[CLASS_SUM]),
    }.items():
        values, vectors = torch.linalg.eigh(gram)
        projected = sums @ vectors
        scores = [
            float((((projected / (values + lam)) @ vectors.T @ val.T).argmax(0) == y["val"]).double().mean()) * 100
            for lam in grid
            if float((values + lam).min()) > 0
        ]
        out[name] = max(scores)
    return out


def plot(files: list[Path], out: Path) -> None:
    """Accuracy against epsilon (log scale), one line per file of rows (``--json``); the non-private figure (epsilon
    inf) as a dashed level in the line's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for file in files:
        rows = json.loads(file.read_text())
        private = sorted((r["epsilon"], r["accuracy"]) for r in rows if math.isfinite(r["epsilon"]))
        (line,) = ax.plot(*zip(*private, strict=True), marker="o", label=file.stem)
        for r in rows:
            if not math.isfinite(r["epsilon"]):
                ax.axhline(r["accuracy"], color=line.get_color(), linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("epsilon (delta 1e-5)")
    ax.set_ylabel("accuracy over 150 intents (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("CLINC150, 5 tasks: privacy and accuracy (dashed: no DP)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=Path(os.environ.get("LORM_DATA_DIR", "datasets")))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lorm-feature-cache"))
    parser.add_argument("--method", choices=("ridge", "ncm"), default="ridge")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1, 2, 4, 8, math.inf])
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=1.0, help="dp.clip (MiniLM's three layers: norm sqrt(1152))")
    parser.add_argument("--gram-share", type=float, default=0.1)
    parser.add_argument("--lambda-scale", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0, help="the run's seed and dp.seed (the noise's)")
    parser.add_argument("--split", choices=("test", "val"), default="test")
    parser.add_argument("--rp-dim", type=int, default=0, help="ridge.rp_dim: a random projection + ReLU (0: none)")
    parser.add_argument("--encoder", default="minilm", help="without --cell: minilm or mpnet (all-mpnet-base-v2)")
    parser.add_argument(
        "--layers", type=int, nargs="+", default=LAYERS, help="without --cell: the hidden states (ridge.layers)"
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--diagnose", action="store_true", help="val accuracy with each statistic's noise alone")
    parser.add_argument("--plot", type=Path, nargs="+", metavar="JSON", help="plot these --json files, run nothing")
    parser.add_argument("--out", type=Path, default=Path("dp_curve.png"), help="with --plot: the image")
    parser.add_argument("--cell", help="the head of this cell of --method-config (e.g. ridge@mpnet-6layers+valx4avg)")
    parser.add_argument("--method-config", type=Path, default=Path(__file__).with_name("clinc150_methods.json"))
    parser.add_argument("--by-length", action="store_true", help="features extracted in batches of similar lengths")
    parser.add_argument("--prior", choices=("chitchat",), help="a public prior before the clip (none by default)")
    parser.add_argument("--prior-size", type=int, nargs="+", default=[20000], help="public utterances encoded")
    parser.add_argument("--prior-k", type=int, nargs="+", default=[128], help="whitened directions kept")
    parser.add_argument("--prior-shrink", type=float, nargs="+", default=[1.0], help="toward the mean eigenvalue")
    parser.add_argument("--prior-seed", type=int, default=0, help="the corpus's shuffle")
    parser.add_argument("--choose", action="store_true", help="choose the prior's size, k and shrink on val")
    parser.add_argument("--write-prior", type=Path, help="also write the prior to this file, for a run's settings")
    parser.add_argument("--choose-seeds", type=int, nargs="+", default=[0, 1, 2], help="noise seeds of --choose")
    args = parser.parse_args(argv)
    if args.plot:
        plot(args.plot, args.out)
        return 0
    torch.set_num_threads(1)
    encoder, settings = head_of(args)
    head = settings[args.method]
    train_val = settings.get("data", {}).get("train_val", False)
    if train_val and (args.split == "val" or args.diagnose):
        raise SystemExit("the cell trains on CLINC150's val split (data.train_val): score the test split")
    if args.choose and (not args.prior or train_val or args.diagnose):
        raise SystemExit("--choose chooses a --prior on the val split: not with data.train_val or --diagnose")
    if not args.choose and args.prior and len(args.prior_size + args.prior_k + args.prior_shrink) > 3:
        raise SystemExit("one --prior-size, --prior-k and --prior-shrink each (several: with --choose)")
    data = load_clinc(args.data_dir)
    splits = ("train", "val") if args.choose else ("train", "val", "test")  # choosing never reads the test split
    states = cached_features(data, args.cache, 64, encoder, args.by_length, splits)
    x = {split: features(states, split, head["layers"], head["norm"]) for split in splits}
    y = {split: torch.from_numpy(data[split][1]) for split in splits}
    hidden = states["train"]["mean"].shape[-1]
    if train_val:  # client/text_datasets.py: the val split follows the train split (global indices after train's)
        x["train"], y["train"] = torch.cat([x["train"], x.pop("val")]), torch.cat([y["train"], y.pop("val")])
    del states, data
    prior = None
    if args.prior:
        public = public_features(args, encoder, head)
        if args.choose:
            choose_prior(args, (settings, hidden), x, y, public)
            return 0
        prior = prior_statement(args, args.prior_size[0], args.prior_k[0], args.prior_shrink[0])
        fitted = fit_prior(public[: prior["size"]], prior["k"], prior["shrink"])
        if args.write_prior:  # the same prior for a run (the settings ncm.prior_*): its rows then equal these
            mapped = {"layers": head["layers"], "pool": head.get("pool", "mean"), "norm": head["norm"]}
            digest = write_prior(args.write_prior, fitted, prior | {"backbone": encoder, "features": mapped})
            section = args.method
            print(
                json.dumps(
                    {
                        "wrote": str(args.write_prior),
                        "set": [f"{section}.prior_digest={digest}", f"{section}.prior_k={prior['k']}"],
                    }
                ),
                flush=True,
            )
        x, settings = with_prior(x, fitted, settings, args.method)
        hidden = prior["k"]
    rows = []
    if args.diagnose:
        for epsilon in args.epsilons:
            print(json.dumps({"epsilon": epsilon, "split": "val", **diagnose(epsilon, args, x, y)}), flush=True)
        return 0
    for epsilon in args.epsilons:
        start = time.perf_counter()
        accuracy, lam, spent = run(args.method, epsilon, args, (settings, hidden), x, y)
        row = {"method": args.cell or args.method, "rp_dim": head.get("rp_dim", 0), "epsilon": epsilon}
        row |= {"delta": args.delta}
        row |= {"accuracy": accuracy, "lambda": lam}
        row |= {"run_epsilon": spent, "seed": args.seed, "split": args.split, "seconds": time.perf_counter() - start}
        row |= {"prior": prior}
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # after every row: a long sweep stopped early keeps the rows it measured
            args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
