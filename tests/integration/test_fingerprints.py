"""No behaviour change: every method's tiny run ends bit-identical to its recorded fingerprint.

The fingerprints (``tests/data/fingerprints.json``) were recorded before the refactors they guard;
a change that alters any merge, training step or evaluation of any method fails here. They
are compared only on a machine of the recording's signature (torch version, CPU model, kernel
capability): other CPUs' float kernels differ in their last bits.
"""

import json

import pytest

from fingerprints import FILE, fingerprint, machine_signature
from server.strategies import STRATEGIES

RECORDED = json.loads(FILE.read_text())


def test_every_method_has_a_fingerprint():
    assert sorted(RECORDED["methods"]) == sorted(STRATEGIES)


@pytest.mark.parametrize("method", sorted(RECORDED["methods"]))
def test_a_tiny_run_is_bit_identical_to_its_fingerprint(method):
    if machine_signature() != RECORDED["machine"]:
        pytest.skip(
            f"fingerprints were recorded on {RECORDED['machine']}, this is {machine_signature()}: "
            "bitwise comparison needs the same float kernels (re-record with python tests/fingerprints.py "
            "--record at the commit before a refactor)"
        )
    assert fingerprint(method) == RECORDED["methods"][method]
