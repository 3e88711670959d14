"""``lorm-spec``: the model description of a run, for ``lorm-server --model-spec``.

The coordinator never builds a model. Given this file it knows the run's model from its
operator rather than from the first client that describes one: a Describe that differs is
refused with the difference named. The file is what every client of the run sends: the
configured backbone with LoRA, a head over the dataset's classes, their names and the tokens a sentence keeps.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from client.classifier import build_model, model_spec, reads_text
from client.datasets import load_dataset
from client.runtime import chosen_max_length
from common.methods.checks import validate
from common.run.arguments import add_config_arguments
from common.run.config import RunConfig
from common.run.schedule import add_schedule_arguments, config_with_schedule, configured_classes, head_classes
from common.run.settings import DataSettings
from common.wire.messages import ModelSpec


def describe(config: RunConfig) -> ModelSpec:
    """The spec a client of ``config`` describes (``client.runtime.ClientRuntime.spec``): its classes are the
    configuration's when it names them (``data.classes``), else the dataset's; its ``max_length`` the
    configuration's, or with 0 the one the clients count from the training split. The data is read only for
    what the configuration leaves open, never for a run on the clients' own data (whose classes the
    coordinator's schedule names, and whose ``max_length`` the configuration fixes)."""
    owned = config.section(DataSettings).owned
    names = configured_classes(config)
    splits = None if names is not None and (owned or config.max_length) else load_dataset(config)
    if splits is not None:
        names = splits.class_names
    assert names is not None  # the configuration's, or the dataset's
    if config.max_length == 0 and splits is not None:
        config = dataclasses.replace(config, max_length=chosen_max_length(config, splits)[0])
    model = build_model(config, head_classes(config, len(names)))
    return model_spec(model, None if owned else tuple(names), config.max_length if reads_text(model) else 0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-spec", description="Write the model description of a run (for lorm-server --model-spec)."
    )
    add_config_arguments(parser)
    add_schedule_arguments(parser)  # the coordinator's own flags: the same run, the same head
    parser.add_argument("--out", required=True, help="the JSON file to write")
    return parser


def config_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RunConfig:
    """The run ``parser``'s ``args`` describe, its schedule flags included (a usage error, exit 2, when it is
    unusable)."""
    try:
        return validate(config_with_schedule(args))
    except (OSError, ValueError) as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    spec = describe(config_of(parser, args))
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(spec.to_json() + "\n")
    tmp.replace(out)
    print(
        f"wrote {out}: {len(spec.layers)} LoRA layers, {len(spec.params)} backbone parameters, "
        f"feature_dim {spec.feature_dim}, {spec.num_classes} classes"
        + (f", max_length {spec.max_length}" if spec.max_length else ""),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
