"""``deterministic``: a client's deterministic kernels (what makes a GPU run repeat bit for bit)."""

from __future__ import annotations

import os

import pytest
import torch

from client.runtime import CUBLAS_DETERMINISTIC, process_settings_kept, use_deterministic
from common.methods import registry
from common.run.config import RunConfig
from engine.simulation import run_inprocess

from fingerprints import TINY, fingerprint


@pytest.fixture
def torch_defaults(monkeypatch):
    """Whatever a test switches on is process-wide: put PyTorch's switches and the variable back."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    with process_settings_kept():
        yield


def test_on_it_switches_every_deterministic_kernel_and_the_cublas_workspace(torch_defaults):
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True

    use_deterministic(True)

    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_reproducible_workspace_already_chosen_is_kept_and_any_other_replaced(torch_defaults, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    use_deterministic(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")  # not one of cuBLAS's reproducible settings
    use_deterministic(True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] in CUBLAS_DETERMINISTIC


def test_off_it_leaves_pytorch_as_it_was(torch_defaults):
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True

    use_deterministic(False)

    assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


@pytest.mark.parametrize("method", sorted(registry()))
def test_every_method_runs_under_deterministic_kernels_with_the_same_bits(method, torch_defaults):
    """No step of any method uses a kernel PyTorch has no deterministic form of (it would raise), and
    on the CPU, deterministic already at a fixed thread count, the setting changes no bit of a run: its
    fingerprint (every tensor it ends with, its counts and losses) is the plain run's."""
    torch.use_deterministic_algorithms(False)
    plain = fingerprint(method)
    assert not torch.are_deterministic_algorithms_enabled()

    determined = fingerprint(method, deterministic=True)

    assert determined == plain
    assert not torch.are_deterministic_algorithms_enabled()  # put back when the run returned


def test_an_inprocess_run_has_its_settings_while_it_runs_and_puts_the_process_back_after(torch_defaults):
    """A grid runs its cells one after another in one process: a cell's ``deterministic`` or ``threads``
    must not carry into the next cell."""
    torch.use_deterministic_algorithms(False)
    threads = torch.get_num_threads()
    other = 2 if threads == 1 else 1
    seen: list[tuple[bool, int, str | None]] = []

    class Spy:
        def __init__(self, worker):
            self.worker = worker

        def handle(self, plan):
            state = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
            seen.append((*state, os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
            return self.worker.handle(plan)

    config = RunConfig(**{**TINY, "threads": other}, method="lorm", deterministic=True)
    run_inprocess(config, wrap=lambda i, worker: Spy(worker))

    assert seen and set(seen) == {(True, other, CUBLAS_DETERMINISTIC[0])}
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == threads
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
