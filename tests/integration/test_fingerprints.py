"""No behaviour change: every method's tiny run ends as its recorded fingerprint says.

The fingerprints (``tests/data/fingerprints.json``, one recording per machine signature) were recorded
before the refactors they guard; a change that alters any merge, training step or evaluation of any method
fails here. They are computed in a child process whose float kernels are pinned to AVX2
(``fingerprints.PINNED``), so that any CPU of a recorded model with AVX2 or more computes the same bits,
and compared bit for bit where the child's signature (torch version, CPU model, pinned capability) has a
recording. Elsewhere the run's values (``tests/data/fingerprints.safetensors``) are compared at the
tolerance of another CPU's kernels (``fingerprints.assert_close_run``), where the software is the same.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from server.strategies import STRATEGIES

from fingerprints import (
    DISCONTINUOUS,
    FILE,
    PINNED,
    VALUES,
    assert_close_run,
    load_values,
    recordings,
    run_tolerance,
    signature_key,
    values_software,
)
from once import computed_once

RECORDINGS = recordings()
RECORDED_VALUES = load_values(VALUES)
SCRIPT = FILE.parents[1] / "fingerprints.py"
METHODS = sorted(STRATEGIES)


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    """Every method's fingerprint and values, the machine's signature and software, from one pinned child (one for
    all the session's workers)."""

    def compute(folder):
        # started without the pins (whatever this shell exports), so that the script must pin them itself
        unpinned = {k: v for k, v in os.environ.items() if k not in PINNED}
        command = [sys.executable, str(SCRIPT), "--out", str(folder / "fingerprints.json")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=unpinned)
        assert done.returncode == 0, done.stderr[-4000:]

    out = computed_once(tmp_path_factory, "fingerprints", compute) / "fingerprints.json"
    return json.loads(out.read_text()) | {"values": load_values(out.with_suffix(".safetensors"))}


def check(method: str, computed: dict) -> str:
    """Compare ``method``'s run with the recording of ``computed``'s machine, bit for bit, or where it has
    none with the recorded values at the tolerance; return which."""
    recording = RECORDINGS.get(signature_key(computed["machine"]), {}).get("methods", {})
    if method in recording:
        assert computed["methods"][method] == recording[method]
        return "bitwise"
    if computed["software"] != values_software(VALUES):
        pytest.skip(
            f"no recording of {computed['machine']}, and its software {computed['software']} is not that of the "
            f"recorded values {values_software(VALUES)}: record it (python tests/fingerprints.py --record at the "
            "commit before a refactor)"
        )
    assert_close_run(method, computed["values"][method], RECORDED_VALUES[method])
    return "tolerance"


def another_machine(computed: dict) -> dict:
    """``computed`` as if from a CPU family with no recording."""
    return computed | {"machine": computed["machine"] | {"cpu": "Another CPU family"}}


def perturbed(method: str, name: str, index: int, by: float) -> tuple[dict, dict]:
    """``method``'s recorded values with ``name``'s ``index``-th entry moved by ``by``."""
    values, shapes = RECORDED_VALUES[method]
    moved = values[name].clone()
    moved[index] += by
    return values | {name: moved}, shapes


def test_every_method_has_a_fingerprint_and_values():
    assert any(sorted(r["methods"]) == METHODS for r in RECORDINGS.values())
    assert sorted(RECORDED_VALUES) == METHODS


def test_the_script_pins_the_kernels_of_its_child(computed):
    # started without PINNED (the fixture removes it), the script re-executes itself under it: on an
    # AVX-512 CPU its torch then reports AVX2, not AVX512
    assert computed["machine"]["capability"] != "AVX512"


@pytest.mark.parametrize("method", METHODS)
def test_a_tiny_run_matches_its_fingerprint(method, computed):
    check(method, computed)


def test_another_cpu_family_compares_every_method_at_the_tolerance(computed):
    other = another_machine(computed)
    assert signature_key(other["machine"]) not in RECORDINGS

    assert {check(method, other) for method in METHODS} == {"tolerance"}


@pytest.mark.parametrize(
    ("method", "name"), [("lorm", "head/weight"), ("lorm", "losses"), ("coda-p", "prompts/coda.prompts")]
)
def test_a_value_moved_beyond_the_tolerance_fails(method, name):
    """Moved by 4 tolerances of the tensor's largest entry, beyond the bound (at most 2: 1 absolute, 1
    relative), a value fails the comparison; by half of one, it passes."""
    expected = RECORDED_VALUES[method]
    ref = expected[0][name]
    ref = ref.nan_to_num(0.0)
    index = int(ref.abs().argmax())
    unit = run_tolerance(int((~expected[0]["losses"].isnan()).sum())) * float(ref.abs().max())

    assert_close_run(method, perturbed(method, name, index, 0.5 * unit), expected)
    with pytest.raises(AssertionError, match=f"{method}: {name} beyond the tolerance"):
        assert_close_run(method, perturbed(method, name, index, 4 * unit), expected)


def test_a_count_may_flip_by_one_and_no_more():
    expected = RECORDED_VALUES["lorm"]

    assert_close_run("lorm", perturbed("lorm", "counts/correct", 1, 1), expected)
    with pytest.raises(AssertionError, match="lorm: correct"):
        assert_close_run("lorm", perturbed("lorm", "counts/correct", 1, 2), expected)


def test_a_discontinuous_method_compares_its_first_task_only():
    method = DISCONTINUOUS[0]
    expected = RECORDED_VALUES[method]
    losses = expected[0]["losses"]
    first = int(losses.isnan().nonzero()[0])

    assert_close_run(method, perturbed(method, "head/weight", 0, 1.0), expected)  # after the first merge
    with pytest.raises(AssertionError, match="losses beyond the tolerance"):
        assert_close_run(method, perturbed(method, "losses", first - 1, float(losses[first - 1]) * 0.1), expected)


def test_a_changed_shape_fails():
    values, shapes = RECORDED_VALUES["fedavg"]
    name = next(n for n in shapes if n.startswith("dense_delta/"))

    with pytest.raises(AssertionError, match="tensors and shapes"):
        assert_close_run("fedavg", (values, shapes | {name: [*shapes[name], 1]}), RECORDED_VALUES["fedavg"])


def test_the_values_are_compact():
    assert VALUES.stat().st_size < 400_000
    assert all(
        t.dtype in (torch.float32, torch.float64, torch.int64) for v, _ in RECORDED_VALUES.values() for t in v.values()
    )
