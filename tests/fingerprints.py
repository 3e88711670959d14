"""Fingerprints of one tiny in-process run per method: what a refactor must leave unchanged.

A fingerprint is the sha256 of every tensor a run ends with (merged adapter, head, dense delta)
and of its accuracy counts and per-step losses. ``python tests/fingerprints.py --record`` adds (or
replaces) this machine's recording in ``tests/data/fingerprints.json``, keyed by its signature
(torch, CPU model, pinned capability), keeping the other machines' recordings; beside it,
``tests/data/fingerprints.safetensors`` holds the values themselves in a compact form (see
:func:`compact`), for the machines that have no recording of their own.

Float kernels differ between CPUs in their last bits: torch, MKL and oneDNN each dispatch on the
instruction set. So the script always computes under :data:`PINNED`, which holds all three to
their AVX2 kernels on one thread (it re-executes itself under them when started without): then an
AVX-512 machine computes the same bits as an AVX2 one (measured: every method of the AVX2
recording, on an AVX-512 AMD EPYC). ``tests/integration/test_fingerprints.py`` runs it so and
compares bit for bit where the signature has a recording, and elsewhere the values at the
tolerance of :func:`run_tolerance`, which a change of kernels stays within and a change of
behaviour does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.run.config import RunConfig  # noqa: E402
from engine.simulation import run_inprocess  # noqa: E402
from server.strategies import STRATEGIES  # noqa: E402

from tolerance import assert_close_to_dtype, rel_tolerance  # noqa: E402

FILE = Path(__file__).with_name("data") / "fingerprints.json"
VALUES = FILE.with_suffix(".safetensors")
# The float kernels every recording and comparison uses. Measured on an AVX-512 AMD EPYC against the AVX2
# recording: torch's and MKL's pins alone differ, torch's and oneDNN's match all 25 methods (MKL kept its
# AVX2 path there unpinned; its pin is for CPUs where MKL would take AVX-512). MKL_CBWR=AVX2 changes the
# bits (a code path of its own), so the recordings are made without it.
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
EXPORTS = ("prompts", "prototypes", "ia3")
TINY = dict(
    num_clients=2,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-2,
    threads=1,
    seed=5,
    min_client_samples=2,
    extra={"synthetic_classes": 6, "synthetic_train": 12, "synthetic_test": 4, "rp_dim": 16},
)


def machine_signature() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu = next(
            (
                line.partition(":")[2].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            cpu,
        )
    return {"torch": torch.__version__, "cpu": cpu, "capability": torch.backends.cpu.get_cpu_capability()}


def software() -> dict[str, str]:
    """The versions that make a tiny run what it is: its model (torch, transformers) and data (numpy). Across
    them it is another run, not a rounding of the same (measured: torch 2.11 and transformers 5.17 start
    from a first loss 0.6 % off 2.14's and 5.24's, before any training step), so values compare only within."""
    import numpy
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": numpy.__version__}


def signature_key(machine: dict[str, str]) -> str:
    """The key of ``machine``'s recording in :data:`FILE`: its torch, CPU model and pinned capability."""
    return " | ".join(machine[k] for k in ("torch", "cpu", "capability"))


def recordings() -> dict[str, dict]:
    """Every machine's recording in :data:`FILE`, by :func:`signature_key`."""
    return json.loads(FILE.read_text())["recordings"] if FILE.is_file() else {}


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


def _tensor(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return str(t.dtype).encode() + str(tuple(t.shape)).encode() + t.numpy().tobytes()


# Method settings that keep a tiny run tiny (TARGET's synthesis: 3 rounds of 4 steps, not 30 of 80).
TINY_SETTINGS = {"target": {"target": {"rounds": 3, "steps": 4, "warmup": 1, "student_steps": 2}}}


def tiny_run(method: str, **changes) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The fingerprint of ``method``'s tiny run (with ``changes`` to its configuration, if any) and the
    values it hashes: every tensor the run ends with, under the fingerprint's field, and its counts and losses."""
    values = {**TINY, "settings": TINY_SETTINGS.get(method, {}), **changes}
    config = RunConfig(run_id=f"fp-{method}", method=method, **values)
    with tempfile.TemporaryDirectory() as out:
        result = run_inprocess(config, results_dir=out)
        delta = Path(out) / "delta.safetensors"
        # The tensors, not the file's bytes: safetensors' header order varies with Python's hash seed.
        dense = load_file(delta) if delta.is_file() else {}
        # a method's own exports (Strategy.exports): L2P's and CODA-P's prompts, FedProto's and PILoRA's
        # prototypes, (IA)^3's vectors
        exports = {
            kind: load_file(Path(out) / f"{kind}.safetensors")
            for kind in EXPORTS
            if (Path(out) / f"{kind}.safetensors").is_file()
        }
    adapter = [_tensor(t) for name in sorted(result.adapter) for t in (result.adapter[name].b, result.adapter[name].a)]
    losses = [entry.get("loss") for entry in result.history]
    prints = {
        "adapter": _digest(*adapter),
        "head": _digest(_tensor(result.head_weight), _tensor(result.head_bias)),
        "dense_delta": _digest(*(name.encode() + _tensor(dense[name]) for name in sorted(dense))),
        "counts": json.dumps([result.matrix.correct, result.matrix.total]),
        "losses": _digest(json.dumps(losses).encode()),
    }
    for kind, named in exports.items():
        prints[kind] = _digest(*(name.encode() + _tensor(named[name]) for name in sorted(named)))
    tensors = {
        **{f"adapter/{name}/{part}": getattr(result.adapter[name], part) for name in result.adapter for part in "ba"},
        "head/weight": result.head_weight,
        "head/bias": result.head_bias,
        **{f"dense_delta/{name}": t for name, t in dense.items()},
        **{f"{kind}/{name}": t for kind, named in exports.items() for name, t in named.items()},
        # a step without a loss (an evaluation) as NaN, so that the steps keep their places
        "losses": torch.tensor([float("nan") if v is None else v for v in losses], dtype=torch.float64),
        "counts/correct": torch.tensor([c for row in result.matrix.correct for c in row], dtype=torch.int64),
        "counts/total": torch.tensor([n for row in result.matrix.total for n in row], dtype=torch.int64),
    }
    return prints, {name: t.detach().cpu().contiguous() for name, t in tensors.items()}


def fingerprint(method: str, **changes) -> dict[str, str]:
    """The fingerprint of ``method``'s tiny run (with ``changes`` to its configuration, if any)."""
    return tiny_run(method, **changes)[0]


# What the compact form leaves out of its values. A dense delta is AdamW's: in coordinates whose gradient is
# ~0 (an attention key's bias; layer 1's query and key weights here), its normalisation turns rounding into
# steps of size lr, so a change of kernels moves them by up to 19 % of the tensor's largest entry (measured,
# ATEN_CPU_CAPABILITY=default against avx2), though the run's losses move by 4 eps: only its names and shapes
# are compared, and the losses, head and counts it leads to.
UNCOMPARED = ("dense_delta",)
# Methods with a discrete choice on rounded values, whose run may branch on the last bit: TIES's trimming of
# the task vectors to their largest magnitudes and sign election, TARGET's synthetic pool (its generator
# chases a student's disagreement). Measured against avx2: the head moves by 2e5 eps (TIES) and 1.4e6 eps
# (TARGET) under ATEN_CPU_CAPABILITY=default, a count flips. Of their values only the first task's losses
# are compared (62 eps at most, measured), besides the shapes and counts every method's are.
DISCONTINUOUS = ("ties", "target")
SAMPLE = 256  # values kept of a tensor: all of one up to this size, every k-th of a larger one
# How much a tiny run grows the difference of one rounding (the ``cond`` of tolerance.rel_tolerance). The
# largest relative difference seen between kernel choices (ATEN_CPU_CAPABILITY avx2, avx512, default;
# MKL_CBWR=AVX2 and COMPATIBLE), over every whole compared tensor of every continuous method, is 4.2e3 eps
# (CODA-P's prompts; 1.3e3 among the stored samples); over the first-order sqrt(steps) = 2 of a 4-step run,
# 2.1e3: so 2**11. With tolerance.SAFETY's 8, a 4-step run is allowed 3.3e4 eps (3.9e-3), 8x the worst seen.
GROWTH = 2.0**11


def compact(values: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """The values of one tiny run as stored: every compared tensor flattened, as float32 (a float64 one
    rounded by 0.5 eps, far inside the tolerance), of a large one every k-th entry, at most :data:`SAMPLE`;
    losses as float64 (Python's floats); counts as they are. And every tensor's shape, compared or not."""
    kept = {}
    for name, t in values.items():
        if name.split("/")[0] in UNCOMPARED:
            continue
        flat = t.flatten()
        if flat.is_floating_point() and name != "losses":
            flat = flat.float()[:: max(math.ceil(flat.numel() / SAMPLE), 1)]
        kept[name] = flat.contiguous()
    return kept, {name: list(t.shape) for name, t in values.items()}


def save_values(
    path: Path, runs: dict[str, tuple[dict[str, torch.Tensor], dict[str, list[int]]]], about: dict[str, str]
) -> None:
    """Write every method's :func:`compact` values and shapes to ``path``, with ``about`` (machine, commit)."""
    tensors = {f"{method}/{name}": t for method, (kept, _) in runs.items() for name, t in kept.items()}
    shapes = {method: shapes for method, (_, shapes) in runs.items()}
    save_file(tensors, str(path), metadata={**about, "shapes": json.dumps(shapes, sort_keys=True)})


def values_software(path: Path) -> dict[str, str]:
    """The :func:`software` that computed the values in ``path``."""
    with safe_open(str(path), framework="pt") as f:
        return json.loads(f.metadata()["software"])


def load_values(path: Path) -> dict[str, tuple[dict[str, torch.Tensor], dict[str, list[int]]]]:
    """Per method, its compact values and its tensors' shapes, as :func:`save_values` wrote them."""
    with safe_open(str(path), framework="pt") as f:
        shapes = json.loads(f.metadata()["shapes"])
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    runs: dict[str, tuple[dict[str, torch.Tensor], dict[str, list[int]]]] = {m: ({}, s) for m, s in shapes.items()}
    for key, t in tensors.items():
        method, _, name = key.partition("/")
        runs[method][0][name] = t
    return runs


def run_tolerance(steps: int) -> float:
    """The relative tolerance of a tiny run of ``steps`` training steps on other kernels (float32's eps,
    grown by :data:`GROWTH`)."""
    return rel_tolerance(torch.float32, terms=steps, cond=GROWTH)


def _first_task(losses: torch.Tensor) -> int:
    """How many steps come before the first evaluation (a NaN loss)."""
    nan = losses.isnan().nonzero()
    return int(nan[0]) if len(nan) else len(losses)


def assert_close_run(method: str, actual: tuple[dict, dict], expected: tuple[dict, dict]) -> None:
    """``actual``'s values of ``method``'s tiny run (from :func:`load_values`) are ``expected``'s at the
    tolerance of other kernels: the same tensors and shapes; each count of correct answers within one (a test
    sample that close to a decision boundary flips), the totals equal; the losses and compared tensors
    within :func:`run_tolerance` of the largest entry (for :data:`DISCONTINUOUS` ones, the first task's)."""
    (values, shapes), (want, want_shapes) = actual, expected
    assert shapes == want_shapes, f"{method}: tensors and shapes {shapes}, recorded {want_shapes}"
    assert sorted(values) == sorted(want), f"{method}: values {sorted(values)}, recorded {sorted(want)}"
    assert torch.equal(values["counts/total"], want["counts/total"]), f"{method}: test totals differ"
    flips = (values["counts/correct"] - want["counts/correct"]).abs()
    assert not flips.numel() or int(flips.max()) <= 1, (
        f"{method}: correct {values['counts/correct']}, recorded {want['counts/correct']}"
    )
    losses, want_losses = values["losses"], want["losses"]
    assert torch.equal(losses.isnan(), want_losses.isnan()), f"{method}: losses {losses}, recorded {want_losses}"
    steps = int((~want_losses.isnan()).sum())
    compared = [n for n in want if not n.startswith("counts/")]
    if method in DISCONTINUOUS:
        first = _first_task(want_losses)
        values, want, compared = {"losses": losses[:first]}, {"losses": want_losses[:first]}, ["losses"]
    for name in compared:
        got, ref = values[name], want[name]
        if name == "losses":
            got, ref = got[~ref.isnan()], ref[~ref.isnan()]
        try:
            assert_close_to_dtype(got, ref, torch.float32, terms=steps, cond=GROWTH)
        except AssertionError as e:
            raise AssertionError(f"{method}: {name} beyond the tolerance {run_tolerance(steps):.3g}: {e}") from None


def commit() -> str:
    """The commit this checkout is at (``+dirty`` with uncommitted changes outside ``tests/``), or ``unknown``."""
    root = FILE.parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!tests"],
            cwd=root,
            capture_output=True,
            text=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def pinned() -> bool:
    """Whether this process runs under :data:`PINNED` (set before torch was imported)."""
    return all(os.environ.get(k) == v for k, v in PINNED.items())


def main() -> int:
    if not pinned():  # the kernels are chosen when torch loads: start again with them pinned
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], os.environ | PINNED)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help=f"add or replace this machine's recording in {FILE}")
    parser.add_argument(
        "--out", type=Path, help="write the fingerprints (and machine) as JSON to this file, the values beside it"
    )
    parser.add_argument(
        "--add-new",
        action="store_true",
        help="record only the methods this machine's recording lacks (a new method), keeping every recorded one",
    )
    args = parser.parse_args()
    machine, everyone = machine_signature(), recordings()
    mine = everyone.get(signature_key(machine), {"methods": {}}) if args.add_new else {"methods": {}}
    if args.add_new and not mine["methods"]:
        parser.error(f"{FILE.name} has no recording of {machine}: record it whole with --record")
    runs = {method: tiny_run(method) for method in sorted(STRATEGIES) if method not in mine["methods"]}
    prints = mine["methods"] | {method: run[0] for method, run in runs.items()}
    about = {"machine": signature_key(machine), "commit": commit(), "software": json.dumps(software(), sort_keys=True)}
    if args.record or args.add_new:
        everyone[signature_key(machine)] = {"machine": machine, "commit": about["commit"], "methods": prints}
        FILE.write_text(json.dumps({"recordings": everyone}, indent=1, sort_keys=True) + "\n")
        stored = load_values(VALUES) if args.add_new else {}
        save_values(VALUES, stored | {method: compact(run[1]) for method, run in runs.items()}, about)
        print(f"wrote {FILE} and {VALUES}")
    text = json.dumps({"machine": machine, "software": software(), "methods": prints}, indent=1, sort_keys=True) + "\n"
    if args.out is not None:
        args.out.write_text(text)
        save_values(args.out.with_suffix(".safetensors"), {m: compact(run[1]) for m, run in runs.items()}, about)
    if not (args.record or args.add_new or args.out is not None):
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
