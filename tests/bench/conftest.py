"""The frozen-feature sweeps of bench/ as modules: ``fh``, ``fv``, ``lex``, ``hc``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench(name: str) -> ModuleType:
    """bench/<name>.py imported by name (the sweeps import feature_heads from beside them, and its
    dataclasses look their module up), so every test sees one module per script."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def fh() -> ModuleType:
    return _bench("feature_heads")


@pytest.fixture(scope="module")
def fv() -> ModuleType:
    return _bench("feature_views")


@pytest.fixture(scope="module")
def lex() -> ModuleType:
    return _bench("lexical_heads")


@pytest.fixture(scope="module")
def hc() -> ModuleType:
    return _bench("heldout_choices")
