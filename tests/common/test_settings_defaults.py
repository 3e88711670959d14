"""Every setting's default, held here: a changed default must be recorded in ``DEFAULT_CHANGES``, by which result
cells that left the setting unset are read with the value they ran with (``lab.provenance.defaults_then``)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

from common.methods import sections
from lab.provenance import DEFAULT_CHANGES

SNAPSHOT = Path(__file__).with_name("settings_defaults.json")
ROOT = Path(__file__).resolve().parents[2]


def today() -> dict[str, dict]:
    return {name: json.loads(json.dumps(dataclasses.asdict(cls()))) for name, cls in sections().items()}


def test_no_default_changed_without_its_record():
    held, now = json.loads(SNAPSHOT.read_text()), today()
    changed = [
        f"{name}.{key}: {held[name][key]!r} -> {now[name][key]!r}"
        for name in sorted(set(held) & set(now))
        for key in sorted(set(held[name]) & set(now[name]))
        if held[name][key] != now[name][key]
    ]
    assert not changed, (
        f"defaults changed: {changed}. Add each to lab.provenance.DEFAULT_CHANGES (its earlier value and the "
        f"commit that changes it), so that stored cells are read with the value they ran with; then update {SNAPSHOT}"
    )
    new = [f"{name}.{key}" for name in now for key in now[name] if key not in held.get(name, {})]
    assert not new, f"settings without a recorded default: {new}; add them to {SNAPSHOT}"


def test_each_recorded_change_names_a_setting_its_earlier_default_and_a_full_commit():
    now = today()
    for change in DEFAULT_CHANGES:
        assert change.key in now[change.section], change
        assert json.loads(json.dumps(change.before)) != now[change.section][change.key], change
        assert re.fullmatch(r"[0-9a-f]{40}", change.commit), change


def test_each_recorded_commit_is_in_this_codes_history():
    """Where git knows the commit (not a shallow clone), the code here holds it."""
    for change in DEFAULT_CHANGES:
        known = subprocess.run(["git", "cat-file", "-e", f"{change.commit}^{{commit}}"], cwd=ROOT, capture_output=True)
        if known.returncode == 0:
            held = subprocess.run(["git", "merge-base", "--is-ancestor", change.commit, "HEAD"], cwd=ROOT)
            assert held.returncode == 0, change
