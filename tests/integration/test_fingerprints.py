"""No behaviour change: every method's tiny run ends bit-identical to its recorded fingerprint.

The fingerprints (``tests/data/fingerprints.json``) were recorded before the refactors they guard;
a change that alters any merge, training step or evaluation of any method fails here. They are
computed in a child process whose float kernels are pinned to AVX2 (``fingerprints.PINNED``), so
that any CPU of the recording's model with AVX2 or more computes the same bits; they are compared
only where the child's signature (torch version, CPU model, pinned capability) is the recording's.
"""

import json
import os
import subprocess
import sys

import pytest

from server.strategies import STRATEGIES

from fingerprints import FILE, PINNED

RECORDED = json.loads(FILE.read_text())
SCRIPT = FILE.parents[1] / "fingerprints.py"


@pytest.fixture(scope="module")
def computed(tmp_path_factory):
    """Every method's fingerprint and the machine's signature, from one pinned child process."""
    out = tmp_path_factory.mktemp("fingerprints") / "fingerprints.json"
    # started without the pins (whatever this shell exports), so that the script must pin them itself
    unpinned = {k: v for k, v in os.environ.items() if k not in PINNED}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=600, env=unpinned
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_every_method_has_a_fingerprint():
    assert sorted(RECORDED["methods"]) == sorted(STRATEGIES)


def test_the_script_pins_the_kernels_of_its_child(computed):
    # started without PINNED (the fixture removes it), the script re-executes itself under it: on an
    # AVX-512 CPU its torch then reports AVX2, not AVX512
    assert computed["machine"]["capability"] != "AVX512"


@pytest.mark.parametrize("method", sorted(RECORDED["methods"]))
def test_a_tiny_run_is_bit_identical_to_its_fingerprint(method, computed):
    if computed["machine"] != RECORDED["machine"]:
        pytest.skip(
            f"fingerprints were recorded on {RECORDED['machine']}, this is {computed['machine']} with its kernels "
            "pinned: bitwise comparison needs the same float kernels (re-record with python tests/fingerprints.py "
            "--record at the commit before a refactor)"
        )
    assert computed["methods"][method] == RECORDED["methods"][method]
