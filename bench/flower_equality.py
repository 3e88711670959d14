"""The same run on the in-process engine (``lorm-sim``) and on Flower's simulation engine, compared: adapter
factors, head and accuracy counts, and each engine's wall time.

    python bench/flower_equality.py --preset cpu-clinc150 --set threads=1
    python bench/flower_equality.py --preset cpu-clinc150 --set threads=1 --set method=lorm-ridge

Prints one JSON object: ``equal`` (every tensor by ``torch.equal`` and the counts), the largest absolute
difference of any tensor where they are not, and the seconds of each engine (run one after the other, in this
process and Flower's Ray workers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from common.methods.checks import validate
from common.run.arguments import add_config_arguments
from common.run.schedule import add_schedule_arguments, config_with_schedule
from engine.simulation import run_inprocess
from flower.simulation import simulate


def largest_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    add_schedule_arguments(parser)
    config = validate(config_with_schedule(parser.parse_args(argv)))

    start = time.perf_counter()
    native = run_inprocess(config)
    native_s = time.perf_counter() - start
    start = time.perf_counter()
    coord = simulate(config).coord
    flower_s = time.perf_counter() - start

    strategy = coord.run.strategy
    assert strategy is not None
    pairs = {"head.weight": (strategy.head_w, native.head_weight), "head.bias": (strategy.head_b, native.head_bias)}
    adapter = strategy.adapter()
    if adapter.keys() != native.adapter.keys():
        raise SystemExit(f"the adapters differ in their layers: {sorted(adapter)} against {sorted(native.adapter)}")
    for name, low in adapter.items():
        pairs[f"{name}.B"] = (low.b, native.adapter[name].b)
        pairs[f"{name}.A"] = (low.a, native.adapter[name].a)
    unequal = {name: largest_difference(a, b) for name, (a, b) in pairs.items() if not torch.equal(a, b)}
    counts = coord.run.matrix.correct == native.matrix.correct and coord.run.matrix.total == native.matrix.total
    print(
        json.dumps(
            {
                "run": config.run_id,
                "method": config.method,
                "clients": config.num_clients,
                "tasks": config.num_tasks,
                "equal": counts and not unequal,
                "counts_equal": counts,
                "tensors_compared": len(pairs),
                "unequal_tensors": unequal,
                "faa": {"in_process": native.matrix.summary()["faa"], "flower": coord.run.matrix.summary()["faa"]},
                "seconds": {"in_process": round(native_s, 1), "flower": round(flower_s, 1)},
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
