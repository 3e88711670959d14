"""``lorm-sim --count-tokens``: each site's number is the ``max_length`` its client would choose under
``max_length=0`` from that file, and the one to give the coordinator is the largest of them."""

from __future__ import annotations

import logging

import pytest

from client.runtime import build_runtime
from common.run.config import RunConfig
from engine.simulation import main

from own_data import write_rows

SHORT = [("set an alarm", "alarm"), ("what is my balance", "balance")] * 10
TEXT = ["--set", "dataset=textfile", "--set", "backbone=tiny-bert"]
LONG = [*SHORT, (" ".join(["please play some music from the seventies"] * 6), "music")]


@pytest.fixture(autouse=True)
def kept_logging(monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


def clients_choice(path) -> int:
    """What a client with ``max_length=0`` chooses from ``path`` as its training file."""
    config = RunConfig(
        dataset="textfile",
        backbone="tiny-bert",
        num_clients=1,
        max_length=0,
        settings={"data": {"train_file": str(path), "test_file": str(path)}},
    )
    return build_runtime(config).config.max_length


def test_each_sites_count_is_its_clients_choice_and_the_largest_is_given(tmp_path, capsys):
    short, long = write_rows(tmp_path / "short.csv", SHORT), write_rows(tmp_path / "long.csv", LONG)
    chosen = {path: clients_choice(path) for path in (short, long)}
    assert chosen[short] < chosen[long]  # one long sentence in 21: the 99th percentile reaches into it
    capsys.readouterr()

    assert main([*TEXT, "--count-tokens", str(short), str(long)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{short}: max_length {chosen[short]}" in out and f"{long}: max_length {chosen[long]}" in out
    largest = chosen[long]
    assert out[-1].startswith(f"the largest: {largest}; start the coordinator with --set max_length={largest}")


def test_a_missing_file_is_named(tmp_path, capsys):
    assert main([*TEXT, "--count-tokens", "nothere.csv"]) == 2
    assert "lorm-sim: error: --count-tokens nothere.csv: no such file" in capsys.readouterr().err
