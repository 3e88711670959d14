"""Regenerate the Python stubs of ``proto/lorm.proto`` (or check that they are fresh).

Usage, from anywhere::

    python proto/generate.py          # rewrite proto/lorm_pb2.py, lorm_pb2.pyi, lorm_pb2_grpc.py
    python proto/generate.py --check  # regenerate into a temp dir; exit 1 if the committed stubs differ

``protoc`` runs in-process from ``grpc_tools`` with the repository root as the include path,
so the descriptor is registered as ``proto/lorm.proto`` and the generated gRPC module
imports its messages package-relative, ``from proto import lorm_pb2``: ``proto`` is a
package of this project, not a top-level module. The import line is normalised after
generation so the output does not depend on how protoc spells it. The stubs are
byte-for-byte reproducible for a given ``grpcio-tools`` version; the version is stamped in
the generated files, so regenerate after upgrading it.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.resources
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("proto") / "lorm.proto"  # relative to ROOT: it becomes the descriptor's file name
GENERATED = ("lorm_pb2.py", "lorm_pb2.pyi", "lorm_pb2_grpc.py")  # written next to lorm.proto

# protoc writes `import lorm_pb2 as lorm__pb2` when the include path is proto/ itself, and
# `from proto import lorm_pb2 as proto_dot_lorm__pb2` when it is the repository root.
_GRPC_IMPORT = re.compile(r"^(?:from [\w.]+ )?import lorm_pb2 as (\w+)$", re.MULTILINE)


def _fix_grpc_import(source: str) -> str:
    """Make the generated gRPC module import its messages as ``from proto import lorm_pb2``."""
    fixed, count = _GRPC_IMPORT.subn(r"from proto import lorm_pb2 as \1", source)
    if count != 1:
        raise RuntimeError(f"expected exactly one `import lorm_pb2` line in lorm_pb2_grpc.py, found {count}")
    return fixed


def generate(out_root: Path) -> list[Path]:
    """Run protoc on ``proto/lorm.proto``; write the stubs under ``out_root/proto/``."""
    (out_root / PROTO.parent).mkdir(parents=True, exist_ok=True)
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {ROOT / PROTO} (see its message above)")
    grpc_module = out_root / PROTO.parent / "lorm_pb2_grpc.py"
    grpc_module.write_text(_fix_grpc_import(grpc_module.read_text()))
    return [out_root / PROTO.parent / name for name in GENERATED]


def stale_stubs() -> list[str]:
    """Regenerate into a temp dir; return a unified diff per committed stub that differs (or is missing)."""
    diffs = []
    with tempfile.TemporaryDirectory() as tmp:
        for fresh in generate(Path(tmp)):
            committed = ROOT / PROTO.parent / fresh.name
            want = fresh.read_text()
            have = committed.read_text() if committed.exists() else ""
            if want != have:
                diff = difflib.unified_diff(
                    have.splitlines(keepends=True),
                    want.splitlines(keepends=True),
                    fromfile=f"committed {committed.relative_to(ROOT)}",
                    tofile="regenerated",
                )
                diffs.append("".join(diff) or f"{committed.relative_to(ROOT)} is missing\n")
    return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        diffs = stale_stubs()
        if diffs:
            sys.stderr.write("".join(diffs))
            sys.stderr.write("proto stubs are stale: run `python proto/generate.py`\n")
            return 1
        print("proto stubs are fresh")
        return 0
    for path in generate(ROOT):
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
