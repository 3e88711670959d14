"""Shared test settings: deterministic, single-threaded torch (tiny models run faster so), in the test
processes and in every process they start."""

import os

# Set before torch is imported, and inherited by every coordinator, client and command a test starts:
# on 2 cores that the test workers' processes already share, a second OpenMP thread per process mostly
# spins waiting for work (the README's walk-through took 3x the CPU time with torch's default of 2).
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

torch.set_num_threads(1)
