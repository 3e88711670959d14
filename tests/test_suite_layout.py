"""The test tree's own rules: the suite collects as a whole, not only folder by folder."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_module_has_a_name_of_its_own() -> None:
    """Test folders are not packages, so pytest imports each module by its basename: a second module of the same
    name (tests/a/test_x.py beside tests/b/test_x.py) fails the whole suite's collection, though each folder
    alone passes."""
    folders: dict[str, list[str]] = defaultdict(list)
    for module in TESTS.rglob("test_*.py"):
        if ".venv" not in module.parts and "__pycache__" not in module.parts:
            folders[module.name].append(str(module.parent.relative_to(TESTS)))
    assert {name: where for name, where in folders.items() if len(where) > 1} == {}
