"""Shared test settings: deterministic, single-threaded torch (tiny models run faster so)."""

import torch

torch.set_num_threads(1)
