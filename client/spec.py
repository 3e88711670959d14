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
from common.run.config import RunConfig, add_config_arguments, config_from_args
from common.run.schedule import configured_classes
from common.wire.messages import ModelSpec


def describe(config: RunConfig) -> ModelSpec:
    """The spec a client of ``config`` describes. Its number of classes is the configuration's when it names
    them (``data.classes``: no data is read, as for clients with their own data), else the dataset's."""
    names = configured_classes(config)
    return model_spec(build_model(config, len(names) if names is not None else load_dataset(config).num_classes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lorm-spec", description="Write the model description of a run (for lorm-server --model-spec)."
    )
    add_config_arguments(parser)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    spec = describe(config_from_args(args))
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
