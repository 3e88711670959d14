"""Every choice of the closed-form heads that touched CLINC150's test split, re-derived on held-out training samples
alone: a script that cannot read the test split.

The data come through :class:`TrainingOnly`, which holds CLINC150's training splits (``train`` and ``val``: the
project counts ``val`` as training data, ``data.train_val``) and raises :class:`TestSplitRefused` when asked for
anything else; the test utterances are dropped as the JSON is parsed, and their features are never opened or
extracted. The held-out rule is the system's (``ridge.holdout=5``, as ``bench/feature_heads.py``): the fitting
samples (train, then val) of global index ``i % 5 == 0`` are held out, the head fitted on the others, λ the one of
least held-out squared error (the decade grid 0.1 .. 1e8, then half a decade each side). Every other choice is
one more setting under the same rule: the option of least held-out squared error at its own λ (its held-out
accuracy printed beside it). The choices:

  lambda_rule  ``ridge.lambda_rule`` of the ensemble ``3456:mean:ln:rp10000x4`` (``ridge@4layers+valx4avg``):
               ``average`` (λ of the average's own held-out error) or ``members`` (the members' errors summed)
  layers       which of MiniLM's layers the head concatenates, on one projection of 10,000 (seed 0)
  views        dropout views of the fitting utterances (``bench/feature_views.py``, weight 1) or none, on one
               projection of the layers ``layers`` chose (the views' record names them)
  gamma_head   LoRM's head γ at β 0.2 on the quick protocol: read from the committed tuning cells of
               ``docs/results/tune-gamma-head``, each of which must have run with ``data.validation`` > 0
               (held-out training samples evaluated in place of the test split); a cell without it is refused.
               Rerunning them is LoRM training (``GAMMA_COMMAND``), not done here.
  gamma_head_full  the same on the full data (``cpu-clinc150-full``), the protocol of the published table: the
               cells of ``docs/results/tune-gamma-head-full`` (``GAMMA_FULL_COMMAND``)
  mpnet_layers with ``--encoder mpnet``, this choice alone: which of all-mpnet-base-v2's blocks the head
               concatenates (``--mpnet-layer-sets``: the last four, the last six, all twelve), on one projection
               of 10,000 (seed 0), as ``layers`` on MiniLM; the best head, ``ridge@mpnet-6layers+valx4avg``, uses
               the last six (their first choice printed the test split beside the held-out figures)

The heads are the system's solve (``ridge_head``: ``S (G + lam I)^-1``), one member's Gram at a time, at every
half decade from 0.1 to 1e8; the rule then looks at the decades first, as the sweeps do.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/heldout_choices.py --cache /tmp/choices-cache
     (writes docs/results/choices/choices.json; about an hour of one core of a shared 2-core EPYC), then
     OMP_NUM_THREADS=1 .venv/bin/python bench/heldout_choices.py --cache /tmp/choices-cache --encoder mpnet --resume
     (``lorm-fetch-model mpnet`` first; adds ``mpnet_layers`` to the same file)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from feature_heads import (  # noqa: E402
    DTYPE,
    FeatureMap,
    Recipe,
    add_data_arguments,
    cached_features,
    features,
)
from feature_views import cached_view  # noqa: E402

from server.strategies.closed_form import ridge_head  # noqa: E402

TRAINING_SPLITS = ("train", "val")  # CLINC150's splits that are training data; "test" is never read
HOLDOUT = 5  # the system's ridge.holdout: fitting samples of global index i % 5 == 0 choose
CHUNK = 4096  # rows of projected features held at once
ROOT = Path(__file__).resolve().parents[1]
GAMMA_CELLS = ROOT / "docs" / "results" / "tune-gamma-head"
GAMMA_COMMAND = (
    'bash bench/tune_lr.sh runs/tune lorm "1e-2:0:gamma_head=0.1 1e-2:0:gamma_head=0.3 1e-2:0:gamma_head=0.5 '
    '1e-2:0:gamma_head=0.7 1e-2:0:gamma_head=0.9" 0.2 cpu-clinc150-quick'
)
GAMMA_FULL_CELLS = ROOT / "docs" / "results" / "tune-gamma-head-full"
GAMMA_FULL_COMMAND = GAMMA_COMMAND.replace("runs/tune ", "runs/tune-full ").replace("-quick", "-full")
GAMMAS = {"gamma_head": GAMMA_CELLS, "gamma_head_full": GAMMA_FULL_CELLS}

V = TypeVar("V")


class TestSplitRefused(LookupError):
    """Raised when anything asks this script for CLINC150's test split."""


class TrainingOnly(Generic[V]):
    """CLINC150's training splits by name (``train``, ``val``); the test split cannot be put in or taken out."""

    def __init__(self, splits: Mapping[str, V]) -> None:
        extra = sorted(set(splits) - set(TRAINING_SPLITS))
        if extra:
            raise TestSplitRefused(f"splits {extra}: this script holds only the training splits {TRAINING_SPLITS}")
        self._splits = dict(splits)

    def __getitem__(self, split: str) -> V:
        if split not in TRAINING_SPLITS:
            raise TestSplitRefused(
                f"split {split!r}: this script reads only the training splits {TRAINING_SPLITS}, never the test split"
            )
        return self._splits[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self._splits)


def load_training(data_dir: Path) -> TrainingOnly[tuple[list[str], np.ndarray]]:
    """Texts and labels of ``train`` and ``val`` (labels index the intents alphabetically, as ``load_clinc``); the
    parsed JSON's other splits are dropped here."""
    raw = json.loads((data_dir / "clinc150" / "data_full.json").read_text())
    kept = {split: raw[split] for split in TRAINING_SPLITS}
    del raw
    index = {name: i for i, name in enumerate(sorted({intent for _, intent in kept["train"]}))}
    return TrainingOnly({s: ([t for t, _ in rows], np.array([index[c] for _, c in rows])) for s, rows in kept.items()})


def training_features(
    data: TrainingOnly[tuple[list[str], np.ndarray]], cache: Path, max_length: int, encoder: str = "minilm"
) -> TrainingOnly[dict[str, np.ndarray]]:
    """The encoder's pooled states of ``train`` and ``val`` (``feature_heads.cached_features``, the test's file not
    opened), extracted into ``cache`` when missing."""
    return TrainingOnly(cached_features(data, cache, max_length, encoder, splits=TRAINING_SPLITS))


@dataclass(frozen=True)
class Candidate:
    """One option's held-out figures at the λ the held-out rule chose for it."""

    lam: float
    error: float  # the held-out samples' squared error, summed
    accuracy: float  # %, of the held-out samples
    seconds: float = 0.0


def choose(options: Mapping[str, Candidate]) -> str:
    """The option of least held-out squared error (the criterion that chooses λ), higher accuracy on a tie."""
    if not options:
        raise ValueError("choose needs at least one option")
    return min(options, key=lambda name: (options[name].error, -options[name].accuracy))


GRID = tuple(10.0 ** (k / 2) for k in range(-2, 17))  # 0.1 .. 1e8 in half decades: LAMBDAS and their halves


def search_grid(error: Callable[[int], float]) -> int:
    """The sweep's rule (``feature_heads.search``) on :data:`GRID`'s indices: the decade of least ``error``, then
    half a decade each side of it (inside the grid)."""
    decade = min(range(0, len(GRID), 2), key=error)
    return min((i for i in (decade - 1, decade, decade + 1) if 0 <= i < len(GRID)), key=error)


class HeldOutRidge:
    """Held-out scores of K ridge members at every λ of :data:`GRID`, solved as the system solves its head.

    ``fit``: rows ``(x (n, F), y (n,), weight)`` the heads are fitted on; ``held``: the held-out ``x``, ``y``.
    One member's Gram at a time: memory of one ``F' x F'`` Gram (and its solve) whatever K.
    """

    def __init__(
        self,
        fit: list[tuple[Tensor, Tensor, float]],
        held: tuple[Tensor, Tensor],
        recipe: Recipe,
        seeds: range,
        classes: int,
    ) -> None:
        self.held_y = held[1]
        self.target = torch.nn.functional.one_hot(held[1], classes).to(DTYPE)  # (n_held, C)
        self.outputs: list[Tensor] = []  # per member: (len(GRID), n_held, C)
        for seed in seeds:
            fmap = FeatureMap(torch.cat([x for x, _, _ in fit]), recipe, seed)  # std: the fitting rows' statistics
            width = fmap.p.shape[0] if fmap.p is not None else fit[0][0].shape[1]
            gram = torch.zeros(width, width, dtype=DTYPE)
            class_sum = torch.zeros(classes, width, dtype=DTYPE)
            for x, y, weight in fit:
                for start in range(0, len(x), CHUNK):
                    phi = fmap(x[start : start + CHUNK])  # (chunk, F')
                    gram.addmm_(phi.T, phi, alpha=weight)
                    class_sum.index_add_(0, y[start : start + CHUNK], phi, alpha=weight)
            held_phi = fmap(held[0])  # (n_held, F')
            self.outputs.append(torch.stack([held_phi @ ridge_head(gram, class_sum, lam).T for lam in GRID]))
            del gram, class_sum, held_phi

    def average(self, index: int, members: range | None = None) -> Tensor:
        """The members' averaged held-out scores ``(n_held, C)`` at ``GRID[index]``."""
        chosen = range(len(self.outputs)) if members is None else members
        return torch.stack([self.outputs[k][index] for k in chosen]).mean(0)

    def score(self, index: int, members: range | None = None) -> tuple[float, float]:
        """Squared error and accuracy (%) of the members' averaged scores."""
        out = self.average(index, members)
        accuracy = 100.0 * float((out.argmax(1) == self.held_y).to(DTYPE).mean())
        return float((out - self.target).pow(2).sum()), accuracy

    def members_error(self, index: int, members: range | None = None) -> float:
        """The members' own held-out squared errors, summed (``ridge.lambda_rule=members``)."""
        chosen = range(len(self.outputs)) if members is None else members
        return sum(float((self.outputs[k][index] - self.target).pow(2).sum()) for k in chosen)

    def chosen(self, rule: str = "average", members: range | None = None, seconds: float = 0.0) -> Candidate:
        """The held-out rule's λ by the average's error (``average``) or the members' summed errors (``members``),
        and the average's figures there."""

        def error(index: int) -> float:
            return self.members_error(index, members) if rule == "members" else self.score(index, members)[0]

        index = search_grid(error)
        held_error, accuracy = self.score(index, members)
        return Candidate(GRID[index], held_error, accuracy, seconds)


def fitting_rows(
    feats: TrainingOnly[dict[str, np.ndarray]], labels: TrainingOnly[np.ndarray], recipe: Recipe
) -> tuple[Tensor, Tensor, Tensor]:
    """The fitting samples (train, then val) as the recipe's features ``(n, F)``, labels, and the held-out mask."""
    x = torch.cat([features(feats[s], recipe) for s in TRAINING_SPLITS])
    y = torch.cat([torch.from_numpy(labels[s]) for s in TRAINING_SPLITS])
    return x, y, torch.arange(len(y)) % HOLDOUT == 0


def ridge_options(
    feats: TrainingOnly[dict[str, np.ndarray]],
    labels: TrainingOnly[np.ndarray],
    recipe: Recipe,
    members: int,
    views: list[np.ndarray] | None = None,
) -> HeldOutRidge:
    """The held-out scores of ``members`` projections of ``recipe`` (``views``: extra rows of the same utterances,
    weight 1, the held-out utterances' views left out of the fit)."""
    x, y, held = fitting_rows(feats, labels, recipe)
    fit = [(x[~held], y[~held], 1.0)]
    for view in views or []:
        vx = features({"mean": view}, recipe)
        fit.append((vx[~held], y[~held], 1.0))
    classes = int(y.max()) + 1
    return HeldOutRidge(fit, (x[held], y[held]), recipe, range(members), classes)


FOUR_LAYERS = Recipe.parse("3456:mean:ln:rp10000")  # the best head's features (ridge@4layers+valx4avg)


def lambda_rules(
    feats: TrainingOnly[dict[str, np.ndarray]], labels: TrainingOnly[np.ndarray]
) -> tuple[dict[str, Candidate], Candidate]:
    """(a) ``average`` against ``members`` on the ensemble of four projections of :data:`FOUR_LAYERS`; and its
    first member alone (seed 0), the four layers' option in (b) and the no-views option in (c)."""
    t0 = time.perf_counter()
    ensemble = ridge_options(feats, labels, FOUR_LAYERS, 4)
    seconds = time.perf_counter() - t0
    rules = {rule: ensemble.chosen(rule, seconds=seconds) for rule in ("average", "members")}
    return rules, ensemble.chosen("average", range(1), seconds / 4)


def layer_set(feats: TrainingOnly[dict[str, np.ndarray]], labels: TrainingOnly[np.ndarray], text: str) -> Candidate:
    """(b) one projection of 10,000 (seed 0) of the layers ``text``, layer-normed."""
    t0 = time.perf_counter()
    single = ridge_options(feats, labels, Recipe.parse(f"{text}:mean:ln:rp10000"), 1)
    return single.chosen(seconds=time.perf_counter() - t0)


def with_views(
    data: TrainingOnly[tuple[list[str], np.ndarray]],
    feats: TrainingOnly[dict[str, np.ndarray]],
    labels: TrainingOnly[np.ndarray],
    views: int,
    cache: Path,
    max_length: int,
    layers: str,
) -> Candidate:
    """(c) one projection of 10,000 (seed 0) of the layers ``layers`` (the pick of (b)), layer-normed, fitted on
    the clean features and ``views`` dropout views of each fitting utterance (``feature_views.py``'s, seeded
    1000 + v, extracted into ``cache`` when missing)."""
    t0 = time.perf_counter()
    dropped = [
        np.concatenate([cached_view(data[s][0], cache, s, max_length, v) for s in TRAINING_SPLITS])
        for v in range(views)
    ]
    viewed = ridge_options(feats, labels, Recipe.parse(f"{layers}:mean:ln:rp10000"), 1, dropped)
    return viewed.chosen(seconds=time.perf_counter() - t0)


@dataclass(frozen=True)
class GammaCell:
    """One committed tuning cell of LoRM's head γ: its FAA on held-out training samples."""

    faa: float
    validation: int  # data.validation: every k-th training sample of each intent evaluated instead of the test split
    commit: str
    seconds: float


def gamma_cells(root: Path, beta: float) -> dict[str, GammaCell]:
    """The committed tuning cells at ``beta`` by γ. A cell that did not run with ``data.validation`` > 0 evaluated
    the test split: it is refused."""
    found: dict[str, GammaCell] = {}
    for file in sorted(root.glob(f"*/cells/lorm/beta{beta:g}/seed*/metrics.json")):
        cell = json.loads(file.read_text())
        validation = cell["config"].get("settings", {}).get("data", {}).get("validation", 0)
        if not validation:
            raise TestSplitRefused(f"{file}: ran without data.validation, so its accuracy is the test split's")
        gamma = f"{cell['config']['gamma_head']:g}"
        found[gamma] = GammaCell(cell["faa"], validation, cell["code"]["commit"], cell["seconds"])
    if not found:
        raise FileNotFoundError(f"no tuning cells at beta {beta:g} under {root}")
    return found


def choose_gamma(cells: Mapping[str, GammaCell]) -> str:
    """The γ of highest held-out FAA (the cells record no squared error)."""
    return max(cells, key=lambda gamma: cells[gamma].faa)


def figures(options: Mapping[str, Candidate | GammaCell]) -> dict[str, dict]:
    return {name: asdict(c) for name, c in options.items()}


CURRENT = {
    "lambda_rule": "average",
    "layers": "3456",
    "views": "0",
    "gamma_head": "0.5",
    "gamma_head_full": "0.7",
    "mpnet_layers": "7,8,9,10,11,12",
}
MPNET_LAYER_SETS = ["9,10,11,12", "7,8,9,10,11,12", "1,2,3,4,5,6,7,8,9,10,11,12"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_arguments(parser)
    parser.add_argument("--layer-sets", nargs="+", default=["456", "3456", "23456", "123456"])
    parser.add_argument("--views", type=int, default=2, help="dropout views against none (0: skip the choice)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results" / "choices" / "choices.json"))
    parser.add_argument(
        "--resume", action="store_true", help="keep the choices and layer sets --out already holds, run the rest"
    )
    parser.add_argument(
        "--mpnet-layer-sets", nargs="+", default=MPNET_LAYER_SETS, help="with --encoder mpnet: the options"
    )
    args = parser.parse_args(argv)
    if args.encoder not in ("minilm", "mpnet"):
        parser.error("--encoder: the choices are MiniLM's, and with mpnet the best head's blocks")
    torch.set_num_threads(args.threads)
    data = load_training(Path(args.data_dir))
    cache = Path(args.cache)
    # the training features, read or extracted at the first choice that needs them (none under --resume when every
    # ridge choice is kept)
    feats = functools.cache(lambda: training_features(data, cache, args.max_length, args.encoder))

    labels = TrainingOnly({s: data[s][1] for s in TRAINING_SPLITS})
    out = Path(args.out)
    # with --encoder mpnet the MiniLM choices are kept as they are in --out, --resume or not
    record: dict[str, dict] = (
        json.loads(out.read_text())["choices"] if (args.resume or args.encoder == "mpnet") and out.exists() else {}
    )
    kept = {  # the ridge choices' options already measured (the γ cells are read again: it costs nothing)
        name: {k: Candidate(**c) for k, c in made["options"].items()}
        for name, made in record.items()
        if name not in GAMMAS and (args.resume or name != "mpnet_layers")
    }

    def log(name: str, options: Mapping[str, Candidate]) -> None:
        pick = choose(options)
        for option, c in options.items():
            mark = "*" if option == pick else " "
            print(
                f"{name:15s} {mark}{option:10s} lambda {c.lam:9.3g} held-out error {c.error:10.2f} "
                f"acc {c.accuracy:6.2f} {c.seconds:6.0f} s",
                flush=True,
            )
        record[name] = {"choice": pick, "current": CURRENT[name], "options": figures(options)}
        write(out, record, args)

    if args.encoder == "mpnet":  # the best head's blocks, beside the MiniLM choices --out already holds
        blocks = kept.get("mpnet_layers", {})
        for text in args.mpnet_layer_sets:
            if text not in blocks:
                blocks[text] = layer_set(feats(), labels, text)
                log("mpnet_layers", blocks)
        log("mpnet_layers", blocks)
        print(f"decision mpnet_layers: {record['mpnet_layers']['choice']} (current {CURRENT['mpnet_layers']})")
        return 0
    for name, root in GAMMAS.items():
        gammas = gamma_cells(root, 0.2)
        pick = choose_gamma(gammas)
        for gamma, cell in gammas.items():
            print(f"{name:15s} {'*' if gamma == pick else ' '}{gamma:10s} held-out FAA {cell.faa:6.2f}", flush=True)
        record[name] = {"choice": pick, "current": CURRENT[name], "options": figures(gammas)}
    if "lambda_rule" in kept:
        four = kept["layers"]["3456"]
    else:
        rules, four = lambda_rules(feats(), labels)
        log("lambda_rule", rules)
    layers = kept.get("layers", {"3456": four})
    for text in args.layer_sets:
        if text not in layers:
            layers[text] = layer_set(feats(), labels, text)
            log("layers", layers)  # after each: a killed run keeps what it measured
    log("layers", layers)
    on = record["layers"]["choice"]  # the views are weighed on the layers the held-out rule chose, after it chose
    if args.views and record.get("views", {}).get("layers") != on:
        log(
            "views",
            {
                "0": layers[on],
                str(args.views): with_views(data, feats(), labels, args.views, cache, args.max_length, on),
            },
        )
        record["views"]["layers"] = on
        write(out, record, args)
    for name, made in record.items():
        print(f"decision {name}: {made['choice']} (current {made['current']})", flush=True)
    return 0


def write(out: Path, record: dict, args: argparse.Namespace) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "holdout": f"fitting samples (train, then val) of global index i % {HOLDOUT} == 0",
        "criterion": "least held-out squared error at the option's own lambda (gamma_head: highest held-out FAA)",
        "threads": args.threads,
        "host": f"{platform.machine()}, {os.cpu_count()} cores",
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "gamma_command": GAMMA_COMMAND,
        "gamma_full_command": GAMMA_FULL_COMMAND,
    }
    out.write_text(json.dumps({"meta": meta, "choices": record}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
