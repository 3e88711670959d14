"""Fingerprints of one tiny in-process run per method: what a refactor must leave bit-identical.

A fingerprint is the sha256 of every tensor a run ends with (merged adapter, head, dense delta)
and of its accuracy counts and per-step losses. ``python tests/fingerprints.py --record`` writes
``tests/data/fingerprints.json``, with the signature of the machine that computed them.

Float kernels differ between CPUs in their last bits: torch, MKL and oneDNN each dispatch on the
instruction set. So the script always computes under :data:`PINNED`, which holds all three to
their AVX2 kernels on one thread (it re-executes itself under them when started without): then an
AVX-512 machine computes the same bits as an AVX2 one (measured: every method of the AVX2
recording, on an AVX-512 AMD EPYC). ``tests/integration/test_fingerprints.py`` runs it so and
compares where the signature (torch, CPU model, the pinned capability) is the recording's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.config import RunConfig  # noqa: E402
from engine.simulation import run_inprocess  # noqa: E402
from server.strategies import STRATEGIES  # noqa: E402

FILE = Path(__file__).with_name("data") / "fingerprints.json"
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


def fingerprint(method: str, **changes) -> dict[str, str]:
    """The fingerprint of ``method``'s tiny run (with ``changes`` to its configuration, if any)."""
    values = {**TINY, "settings": TINY_SETTINGS.get(method, {}), **changes}
    config = RunConfig(run_id=f"fp-{method}", strategy=method, **values)
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
    out = {
        "adapter": _digest(*adapter),
        "head": _digest(_tensor(result.head_weight), _tensor(result.head_bias)),
        "dense_delta": _digest(*(name.encode() + _tensor(dense[name]) for name in sorted(dense))),
        "counts": json.dumps([result.matrix.correct, result.matrix.total]),
        "losses": _digest(json.dumps(losses).encode()),
    }
    for kind, named in exports.items():
        out[kind] = _digest(*(name.encode() + _tensor(named[name]) for name in sorted(named)))
    return out


def pinned() -> bool:
    """Whether this process runs under :data:`PINNED` (set before torch was imported)."""
    return all(os.environ.get(k) == v for k, v in PINNED.items())


def main() -> int:
    if not pinned():  # the kernels are chosen when torch loads: start again with them pinned
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], os.environ | PINNED)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--record", action="store_true", help=f"write {FILE}")
    parser.add_argument("--out", type=Path, help="write the fingerprints (and machine) as JSON to this file")
    parser.add_argument(
        "--add-new",
        action="store_true",
        help=f"record only the methods {FILE.name} lacks (a new method), keeping every recorded one as it is",
    )
    args = parser.parse_args()
    recorded = json.loads(FILE.read_text()) if args.add_new else {"methods": {}}
    if args.add_new and recorded["machine"] != machine_signature():
        parser.error(f"{FILE.name} was recorded on {recorded['machine']}; this is {machine_signature()}")
    prints = recorded["methods"] | {
        method: fingerprint(method) for method in sorted(STRATEGIES) if method not in recorded["methods"]
    }
    text = json.dumps({"machine": machine_signature(), "methods": prints}, indent=1, sort_keys=True) + "\n"
    if args.record or args.add_new:
        FILE.write_text(text)
        print(f"wrote {FILE}")
    if args.out is not None:
        args.out.write_text(text)
    if not (args.record or args.add_new or args.out is not None):
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
