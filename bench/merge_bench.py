"""Merge cost per round at ViT-B/16 shapes, measured and as a FLOP bound.

Work timed (all 48 LoRA layers: 12 blocks x qkv, proj, fc1, fc2; rank r; diagonal Grams,
i.e. backbone gamma = 0):
  B-round     fold N clients' (B_i, g_i) into LoraBAccumulator and solve (r x r).
  A-round     fold N clients' (A_i, g_i) into LoraAAccumulator and solve (element-wise).
  task merge  fold T tasks' (B^t, A^t, G^t) into TaskMergeAccumulator and solve.
  dense dW    B_cat @ A_cat for every layer (only needed to export or evaluate W0 + dW).

Client tensors are float32, as they arrive over the wire; the merge converts to float64.
The FLOP-bound time is the FLOP count divided by this machine's float64 matmul throughput,
measured first; the ratio says how far each merge is from compute-bound.

Run: .venv/bin/python bench/merge_bench.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.merges.regmean import LoraAAccumulator, LoraBAccumulator, TaskMergeAccumulator  # noqa: E402

BLOCKS = 12
# (d_out, d_in) of qkv, proj, fc1, fc2 in every block
LAYERS = [(2304, 768), (768, 768), (3072, 768), (768, 3072)] * BLOCKS
RANK = 16
CLIENTS = 10
TASKS = 10
REPEATS = 5


def median_seconds(work: Callable[[], object], repeats: int = REPEATS) -> float:
    work()  # warm-up: allocator, kernels
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_flops_per_second(n: int = 1024, repeats: int = 7) -> float:
    """Peak float64 throughput: the best of ``repeats`` ``(n, n) @ (n, n)`` matmuls (2 n^3 FLOPs)."""
    a, b = torch.randn(n, n, dtype=torch.float64), torch.randn(n, n, dtype=torch.float64)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# ----------------------------------------------------------------------------- FLOP counts
# Matmul (p, k) @ (k, q) = 2 p k q; element-wise ops 1 per element; conversions and copies 0.


def b_round_flops(n: int, r: int) -> int:
    total = 0
    for d_out, d_in in LAYERS:
        fold = r * d_in + 2 * r * r * d_in + 2 * d_out * r * r  # A*g, (A g) A^T, B_i (A G A^T)
        sums = (n - 1) * (d_out * r + r * r)
        # Jacobi scaling, Cholesky, two triangular solves, unscaling
        solve = 2 * r * r + r**3 // 3 + 2 * d_out * r * r + 2 * d_out * r
        total += n * fold + sums + solve
    return total


def a_round_flops(n: int, r: int) -> int:
    total = 0
    for _, d_in in LAYERS:
        total += n * r * d_in + (n - 1) * (r * d_in + d_in) + r * d_in  # A_i*g_i, sums, divide
    return total


def task_merge_flops(t: int, r: int) -> int:
    total = 0
    for _, d_in in LAYERS:
        total += t * r * d_in + (t - 1) * d_in + t * r * d_in  # A^t*g^t, Gram sum, divide
    return total


def dense_dw_flops(t: int, r: int) -> int:
    return sum(2 * d_out * t * r * d_in for d_out, d_in in LAYERS)


# ----------------------------------------------------------------------------- work


def make_round_inputs(gen: torch.Generator) -> list[dict[str, object]]:
    """Per layer: the shared factors and every client's (B_i, A_i, g_i) in float32."""
    layers = []
    for d_out, d_in in LAYERS:
        layers.append(
            {
                "d_out": d_out,
                "d_in": d_in,
                "a": torch.randn(RANK, d_in, generator=gen),
                "bs": [torch.randn(d_out, RANK, generator=gen) for _ in range(CLIENTS)],
                "as": [torch.randn(RANK, d_in, generator=gen) for _ in range(CLIENTS)],
                "gs": [torch.rand(d_in, generator=gen) * 1e4 for _ in range(CLIENTS)],
            }
        )
    return layers


def b_round(layers: list[dict]) -> list[torch.Tensor]:
    out = []
    for layer in layers:
        acc = LoraBAccumulator(layer["a"], layer["d_out"])
        for b, g in zip(layer["bs"], layer["gs"]):
            acc.fold(b, g)
        out.append(acc.result())
    return out


def a_round(layers: list[dict]) -> list[torch.Tensor]:
    out = []
    for layer in layers:
        acc = LoraAAccumulator(RANK, layer["d_in"])
        for a, g in zip(layer["as"], layer["gs"]):
            acc.fold(a, g)
        out.append(acc.result())
    return out


def task_merge(layers: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    # T tasks' stored factors and Grams; the clients' round tensors stand in for them.
    out = []
    for layer in layers:
        acc = TaskMergeAccumulator(layer["d_out"], layer["d_in"])
        for t in range(TASKS):
            acc.fold(layer["bs"][t], layer["as"][t], layer["gs"][t])
        out.append(acc.result())
    return out


def table(layers: list[dict]) -> None:
    flops_per_s = matmul_flops_per_second()
    print(f"{torch.get_num_threads()} thread(s); float64 matmul 1024^3: {flops_per_s / 1e9:.1f} GFLOP/s")
    merged = task_merge(layers)
    rows = [  # (work, measured seconds, FLOPs)
        ("B-round (fold 10 + solve)", median_seconds(lambda: b_round(layers)), b_round_flops(CLIENTS, RANK)),
        ("A-round (fold 10 + solve)", median_seconds(lambda: a_round(layers)), a_round_flops(CLIENTS, RANK)),
        ("task merge, T = 10 (factors)", median_seconds(lambda: task_merge(layers)), task_merge_flops(TASKS, RANK)),
        ("dense dW = B_cat @ A_cat", median_seconds(lambda: [b @ a for b, a in merged]), dense_dw_flops(TASKS, RANK)),
    ]
    header = f"{'work':30s} {'measured s':>11s} {'FLOPs':>10s} {'FLOP-bound s':>13s} {'ratio':>8s}"
    print(header)
    print("-" * len(header))
    for name, seconds, flops in rows:
        bound = flops / flops_per_s
        print(f"{name:30s} {seconds:11.4f} {flops:10.3e} {bound:13.2e} {seconds / bound:8.1f}")


def main() -> None:
    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}; ViT-B/16: {len(LAYERS)} layers, r = {RANK}, {CLIENTS} clients, "
        f"{TASKS} tasks, diagonal Grams; median of {REPEATS} runs; ratio = measured / FLOP-bound"
    )
    layers = make_round_inputs(torch.Generator().manual_seed(0))
    default_threads = torch.get_num_threads()
    print("\n[default threads]")
    table(layers)
    if default_threads > 1:
        # Small tensors gain nothing from intra-op threads, and on a loaded machine the
        # threads' synchronisation can dominate: the single-thread table shows the difference.
        torch.set_num_threads(1)
        print("\n[1 thread, for comparison]")
        table(layers)
        torch.set_num_threads(default_threads)


if __name__ == "__main__":
    main()
