"""What a client keeps to itself: where its data and weight files lie, which model source it loads.

The coordinator's configuration says what the run computes (the dataset, the backbone, the method); it
must not say which files on a client's disk are read, or which hub repository a client downloads and
runs. :func:`refuse_coordinator_local` refuses a Join reply that does, naming the setting; the client's
own flags and environment (:class:`LocalSettings`) give them instead, and :func:`applied` writes them into
the configuration the client builds its data and model from. ``LORM_MODEL_HOME`` (``client.pretrained``)
says where fetched encoders lie; nothing in a configuration does.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, replace

from client.owned import OwnData, client_files
from common.run.config import CLIENT_LOCAL, RunConfig, client_local_values, without_client_local
from common.run.settings import DataSettings, ModelSettings

ENV_DATA_DIR = "LORM_DATA_DIR"
ENV_WEIGHTS = "LORM_MODEL_WEIGHTS"
ENV_BACKBONE = "LORM_BACKBONE"
ENV_OWN_DATA = "LORM_CLIENT_DATA"
ENV_OWN_TEST_DATA = "LORM_CLIENT_TEST_DATA"


class LocalSettingError(ValueError):
    """The coordinator's configuration names a setting that is the client's own."""


@dataclass(frozen=True)
class LocalSettings:
    """A client's own paths and model source, from its flags and environment ("": not given)."""

    data_dir: str = ""  # the folder holding the datasets (dataset_files.data_dir falls back to $LORM_DATA_DIR)
    train_file: str = ""  # textfile: the training samples
    test_file: str = ""  # textfile: the test samples
    image_root: str = ""  # imagefolder: the folder with train/ and test/
    weights: str = ""  # timm ViTs: a local model.safetensors
    backbone: str = ""  # the model source this client loads for the run's backbone: a local directory or hub name
    data: str = ""  # this client's own training data (client/owned.py): a text file or an image folder
    test_data: str = ""  # its own test split, as data ("": it evaluates nothing)
    clients_dir: str = ""  # a launcher's folder of every client's own data (client.owned.client_files); no flag

    def own(self) -> OwnData | None:
        """This client's own data, or ``None`` when it trains on its shard of a common dataset."""
        return OwnData(self.data, self.test_data) if self.data else None

    def for_client(self, index: int) -> LocalSettings:
        """Client ``index``'s settings: with ``clients_dir``, its own files in it as ``data`` and ``test_data``."""
        if not self.clients_dir:
            return self
        own = client_files(self.clients_dir, index)
        return replace(self, data=own.train, test_data=own.test, clients_dir="")

    def args(self) -> list[str]:
        """The ``lorm-client`` flags that give these settings (for a launcher that starts clients)."""
        assert not self.clients_dir, "one client's flags: resolve clients_dir with for_client first"
        flags = {
            "--data-dir": self.data_dir,
            "--train-file": self.train_file,
            "--test-file": self.test_file,
            "--image-root": self.image_root,
            "--weights": self.weights,
            "--backbone": self.backbone,
            "--data": self.data,
            "--test-data": self.test_data,
        }
        return [item for flag, value in flags.items() if value for item in (flag, value)]


def registered_backbone(name: str) -> bool:
    """A backbone of ``client.backbone_builders.BACKBONES``: its source is fixed by this code, not by a
    configuration."""
    from client.backbone_builders import BACKBONES

    return name in BACKBONES


def refuse_coordinator_local(config: RunConfig, local: LocalSettings) -> None:
    """:class:`LocalSettingError` naming the first client-local setting the coordinator's ``config`` sets:
    a data path, a weight file, or a backbone that is a local path or hub repository (unless this client
    gives its own source for it with ``--backbone``)."""
    for key, value in client_local_values(config).items():
        what = "data paths" if key.startswith("data") else "weight files"
        raise LocalSettingError(
            f"the coordinator's configuration sets {key}={value}: a client's {what} are its own; "
            f"pass {CLIENT_LOCAL[key]} on the client"
        )
    if not local.backbone and not registered_backbone(config.backbone):
        raise LocalSettingError(
            f"the coordinator's configuration sets backbone={config.backbone}, a local path or hub repository: "
            "a client's model sources are its own; pass --backbone SOURCE (or LORM_BACKBONE) on the client, "
            "the local directory or hub name of that model that this client trusts"
        )


def check_own_data(config: RunConfig, local: LocalSettings) -> None:
    """:class:`LocalSettingError` unless this client's data is what the run's clients train on: its own
    (``--data``) in a run of ``data.owned``, else its shard of the run's dataset."""
    owned = config.section(DataSettings).owned
    if owned and not local.data:
        raise LocalSettingError(
            "the run's clients train on their own data (the coordinator's configuration sets data.owned=true): "
            "pass --data PATH (or LORM_CLIENT_DATA), a .csv or .jsonl of text and label or a folder of class folders"
        )
    if local.data and not owned:
        raise LocalSettingError(
            "this client was given --data, but the run's clients train on their shards of its dataset "
            f"{config.dataset!r} (the coordinator's configuration does not set data.owned=true)"
        )


def applied(config: RunConfig, local: LocalSettings) -> RunConfig:
    """``config`` (already free of client-local settings) with this client's own written in."""
    data = {"train_file": local.train_file, "test_file": local.test_file, "root": local.image_root}
    settings = {name: dict(values) for name, values in config.settings.items()}
    for section, values in (("data", data), ("model", {"weights": local.weights})):
        given = {k: v for k, v in values.items() if v}
        if given:
            settings[section] = {**settings.get(section, {}), **given}
    return config.replace(
        data_dir=local.data_dir or config.data_dir, backbone=local.backbone or config.backbone, settings=settings
    )


def split(config: RunConfig) -> tuple[RunConfig, LocalSettings]:
    """A configuration that plays both parties (``lorm-launch``) as what its coordinator may send and what its
    clients give themselves."""
    data, model = config.section(DataSettings), config.section(ModelSettings)
    backbone = "" if registered_backbone(config.backbone) else config.backbone
    local = LocalSettings(
        config.data_dir,
        data.train_file,
        data.test_file,
        data.root,
        model.weights,
        backbone,
        clients_dir=data.clients_dir,
    )
    return without_client_local(config), local


def add_local_arguments(parser: argparse.ArgumentParser) -> None:
    """The client's own paths and model source, flags of ``lorm-client``."""
    env = os.environ.get
    g = parser.add_argument_group("this client's own files (the coordinator's configuration may name none of them)")
    g.add_argument(
        "--data-dir",
        default=env(ENV_DATA_DIR, ""),
        metavar="DIR",
        help=f"the folder holding the datasets, e.g. DIR/clinc150/ (default ${ENV_DATA_DIR})",
    )
    g.add_argument("--train-file", default="", metavar="FILE", help="textfile: the training samples (.csv or .jsonl)")
    g.add_argument("--test-file", default="", metavar="FILE", help="textfile: the test samples")
    g.add_argument("--image-root", default="", metavar="DIR", help="imagefolder: the folder with train/ and test/")
    g.add_argument(
        "--weights",
        default=env(ENV_WEIGHTS, ""),
        metavar="FILE",
        help=f"timm ViTs: a local model.safetensors instead of the Hugging Face cache or hub (default ${ENV_WEIGHTS})",
    )
    g.add_argument(
        "--backbone",
        default=env(ENV_BACKBONE, ""),
        metavar="SOURCE",
        help="load the run's backbone from SOURCE, a local model directory or bert:/t5:/timm: hub name "
        f"(needed when the run's backbone is no packaged name; default ${ENV_BACKBONE})",
    )
    g.add_argument(
        "--data",
        default=env(ENV_OWN_DATA, ""),
        metavar="PATH",
        help="train on this client's own data instead of its shard of the run's dataset: a .csv or .jsonl of "
        "text and label, or a folder of class-named image folders; labels are the run's class names, and "
        f"samples of a label in no task are left out (default ${ENV_OWN_DATA})",
    )
    g.add_argument(
        "--test-data",
        default=env(ENV_OWN_TEST_DATA, ""),
        metavar="PATH",
        help=f"with --data: this client's own test split, as --data (default ${ENV_OWN_TEST_DATA}; "
        "none: it evaluates nothing)",
    )


def local_from_args(args: argparse.Namespace) -> LocalSettings:
    """The client's own settings from its flags; ``ValueError`` naming the flags that contradict each other."""
    if args.test_data and not args.data:
        raise ValueError("--test-data is the test split of --data: give --data too")
    if args.data:
        shard_flags = {"--train-file": args.train_file, "--test-file": args.test_file, "--image-root": args.image_root}
        given = [flag for flag, value in shard_flags.items() if value]
        if given:
            raise ValueError(f"--data is this client's whole training data; it takes no {', '.join(given)}")
    return LocalSettings(
        args.data_dir,
        args.train_file,
        args.test_file,
        args.image_root,
        args.weights,
        args.backbone,
        data=args.data,
        test_data=args.test_data,
    )
