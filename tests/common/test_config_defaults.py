"""Defaults that follow the dataset: a text dataset of your own with no backbone named gets the pretrained MiniLM."""

from __future__ import annotations

import argparse

from common.run.arguments import add_config_arguments, config_from_args
from common.run.config import RunConfig


def from_flags(*flags: str) -> RunConfig:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    return config_from_args(parser.parse_args(list(flags)))


def test_own_text_without_a_backbone_gets_the_pretrained_minilm():
    assert RunConfig(dataset="textfile").backbone == "minilm"
    assert from_flags("--set", "dataset=textfile", "--set", "data.train_file=t.csv").backbone == "minilm"
    assert RunConfig.from_json(RunConfig(dataset="textfile").to_json()).backbone == "minilm"  # sent resolved


def test_a_named_backbone_and_the_other_datasets_keep_theirs():
    assert RunConfig(dataset="textfile", backbone="tiny-bert").backbone == "tiny-bert"
    assert from_flags("--set", "dataset=textfile", "--set", "backbone=mpnet").backbone == "mpnet"
    assert RunConfig().backbone == "tiny-bert" and RunConfig(dataset="clinc150").backbone == "tiny-bert"
    assert RunConfig(dataset="imagefolder").backbone == "tiny-bert"  # the images preset names its ViT
