"""Load: 200 concurrent clients, each on its own gRPC channel, through one coordinator process.

Runs ``bench/load_bench.py``'s measurement: every update acknowledged as new, the committed
merge made of all N clients and bit-identical to an in-process fold of the same updates,
and the coordinator's memory bounded while they push.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20


def load_bench():
    spec = importlib.util.spec_from_file_location("load_bench", ROOT / "bench" / "load_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def state_root(tmp_path: Path) -> Path:
    """tmpfs when there is one: the joins' and stagings' fsyncs would dominate on a busy disk."""
    shm = Path("/dev/shm")
    if shm.is_dir():
        return Path(tempfile.mkdtemp(prefix="lorm-test-load-", dir=shm))
    return tmp_path


@pytest.mark.slow  # a load experiment: 48 s of a worker on 2 cores
def test_200_clients_push_concurrently_and_every_update_counts(tmp_path):
    bench = load_bench()
    root = state_root(tmp_path)
    try:
        r = bench.measure(200, bench.TINY, 1, root)
    finally:
        if root != tmp_path:
            shutil.rmtree(root, ignore_errors=True)
    assert r["merged_clients"] == 200
    assert r["merged_equal"]
    # Tiny updates: whatever the pushes add is per-connection overhead, not per-client state.
    assert r["peak_rss"] - r["base_rss"] < 96 * MIB, (r["base_rss"] / MIB, r["peak_rss"] / MIB)


@pytest.mark.slow
def test_vit_b16_updates_memory_does_not_grow_with_clients(tmp_path):
    """50 and then 200 clients pushing rank-1 ViT-B/16 updates (5.9 MB each, 1.2 GB in all)."""
    bench = load_bench()
    runs = {}
    for n in (50, 200):
        (tmp_path / str(n)).mkdir()
        runs[n] = bench.measure(n, bench.VIT_B16, 1, tmp_path / str(n))
        assert runs[n]["merged_clients"] == n and runs[n]["merged_equal"]
    # At most the server's worker threads hold an update each, whatever N is.
    assert runs[200]["peak_rss"] < runs[50]["peak_rss"] * 1.25 + 64 * MIB, {
        n: r["peak_rss"] / MIB for n, r in runs.items()
    }
