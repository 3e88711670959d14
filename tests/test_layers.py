"""The import graph reads top-down: engine above server and client, both above common; the wire at the edges.
The inference package (serve/) stands on the client's model code and common, beside the coordinator."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the project packages it must never import
FORBIDDEN = {
    "common": {"server", "client", "engine", "proto", "serve"},
    "server": {"client", "engine", "serve"},
    "client": {"server", "engine", "serve"},
    "proto": {"server", "client", "engine", "serve"},
    "serve": {"server", "engine", "proto"},  # an export is read from files: no coordinator code, no wire
}
# Imports across the client/server line, each with its reason: none. (Secure aggregation's client builds the
# step's aggregator with common.methods.make_aggregator, the coordinator's own, from the shared layer.)
EXCEPTIONS: dict[str, set[str]] = {}
# Only these modules speak the project's protobuf wire (proto/: the stubs and their codec): the servicer,
# the client's transport, and the operator's command (lorm-admin, a caller of the Operator service).
WIRE_EDGES = {"server/service.py", "client/transport.py", "server/admin.py"}


def imports(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_imports_a_layer_above_or_beside_it(package):
    wrong = {
        str(p.relative_to(ROOT)): sorted(
            m
            for m in imports(p)
            if m.split(".")[0] in FORBIDDEN[package] and m not in EXCEPTIONS.get(str(p.relative_to(ROOT)), set())
        )
        for p in modules(package)
    }
    assert {p: m for p, m in wrong.items() if m} == {}


def test_only_the_servicer_and_the_client_transport_import_the_wire():
    speakers = {
        str(p.relative_to(ROOT))
        for package in ("common", "server", "client", "engine", "serve")
        for p in modules(package)
        if any(m.split(".")[0] == "proto" or m.startswith("google.protobuf") for m in imports(p))
    }
    assert speakers == WIRE_EDGES


def test_the_checker_sees_imports_inside_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from client.runtime import build_runtime\n    import proto.codec\n")
    assert imports(source) == {"client.runtime", "proto.codec"}
