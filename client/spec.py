"""``lorm-spec``: the model description of a run, for ``lorm-server --model-spec``.

The coordinator never builds a model. Given this file it knows the run's model from its
operator rather than from the first client that describes one: a Describe that differs is
refused with the difference named. The file is what every client of the run sends: the
configured backbone with LoRA, and a head over the dataset's classes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from client.backbones import build_model, model_spec
from client.datasets import load_dataset
from common.run.config import RunConfig, add_config_arguments
from common.run.schedule import add_schedule_arguments, config_with_schedule, configured_classes, head_classes
from common.wire.messages import ModelSpec


def describe(config: RunConfig) -> ModelSpec:
    """The spec a client of ``config`` describes. Its head's rows are the configuration's when it names the
    classes (``data.classes``, or a schedule: no data is read, as for clients with their own data; with
    ``data.max_classes`` rows for the classes an open run may add), else the dataset's classes."""
    names = configured_classes(config)
    rows = head_classes(config, len(names)) if names is not None else load_dataset(config).num_classes
    return model_spec(build_model(config, rows))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lorm-spec", description="Write the model description of a run (for lorm-server --model-spec)."
    )
    add_config_arguments(parser)
    add_schedule_arguments(parser)  # the coordinator's own flags: the same run, the same head
    parser.add_argument("--out", required=True, help="the JSON file to write")
    return parser


def config_of(parser: argparse.ArgumentParser, argv: list[str] | None) -> RunConfig:
    """The run ``argv`` describes, its schedule flags included (a usage error, exit 2, when it is unusable)."""
    args = parser.parse_args(argv)
    try:
        return config_with_schedule(args)
    except (OSError, ValueError) as err:
        parser.error(str(err))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    spec = describe(config_of(parser, argv))
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(spec.to_json() + "\n")
    tmp.replace(out)
    print(
        f"wrote {out}: {len(spec.layers)} LoRA layers, {len(spec.params)} backbone parameters, "
        f"feature_dim {spec.feature_dim}, {spec.num_classes} classes",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
