"""The import graph reads top-down: engine above server and client, both above common; the wire at the edges.
The inference package (serve/) stands on the client's model code and common, beside the coordinator. The lab
(lab/: the benchmark and the figures) stands above them all, and no product package imports it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the project packages it must never import
FORBIDDEN = {
    "common": {"server", "client", "engine", "proto", "serve", "lab"},
    "server": {"client", "engine", "serve", "lab"},
    "client": {"server", "engine", "serve", "lab"},
    "proto": {"server", "client", "engine", "serve", "lab"},
    "serve": {"server", "engine", "proto", "lab"},  # an export is read from files: no coordinator code, no wire
    "engine": {"lab"},
    "deploy": {"lab"},
}
# The lab (lab/: the benchmark grid, its report and RESULTS' tables) stands above every product package and may
# import any of them; none of them imports it.
# Imports across the client/server line, each with its reason: none. (Secure aggregation's client builds the
# step's aggregator with common.aggregation.base.make_aggregator, the coordinator's own, from the shared layer.)
EXCEPTIONS: dict[str, set[str]] = {}
# Only these modules speak the project's protobuf wire (proto/: the stubs and their codec): the servicer,
# the client's transport, and the operator's command (lorm-admin, a caller of the Operator service).
# The transports (gRPC both ends, and the in-process one that hands a client the wire's data) and the operator's command
WIRE_EDGES = {"server/service.py", "client/transport.py", "engine/transport.py", "server/admin.py"}


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


# common/ by concern: each package may import (when its modules load) only the packages listed.
CONCERNS = {
    "typed": set(),  # a frozen dataclass from decoded JSON: the one parser of the settings and the instructions
    "wire": {"typed"},  # the envelopes, named tensors and the model card
    "run": {"typed"},  # RunConfig, the typed settings, presets, partition, metrics
    "merges": set(),  # the closed-form merges: pure math
    "adapters": set(),  # LoRA, VeRA, (IA)^3, prompts
    "infra": {"wire"},  # logs (which format a plan's step), progress, faults, TLS
    # differential privacy: calibrations, noise, the ledgers (which read a step's plan), public priors (files)
    "privacy": {"run", "wire", "infra"},
    # the protocol, the terms a client masks, and the noise a client adds to them (distributed DP)
    "secagg": {"infra", "wire", "run", "merges", "privacy"},
    # Above those eight, the methods and how their updates fold, each beside the other: the registry
    # (methods/__init__.py) imports only run/; the aggregators look a run's method up in it, each method's slice builds
    # on the aggregators, and the registry's checks of a run's configuration (methods/checks.py) on secagg/'s threshold.
    # No module cycle between them: test_no_import_cycle_in_common.
    "methods": {"run", "wire", "adapters", "merges", "secagg", "aggregation"},
    "aggregation": {"run", "wire", "adapters", "merges", "methods"},
}


def _add_imported(node: ast.Import | ast.ImportFrom, found: set[str]) -> None:
    """Add what ``node`` imports to ``found``: ``from a.b import c`` names ``a.b.c`` where that is a module, else
    ``a.b``."""
    if isinstance(node, ast.Import):
        found.update(alias.name for alias in node.names)
    elif node.level == 0 and node.module:
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            as_path = ROOT / sub.replace(".", "/")
            found.add(sub if as_path.with_suffix(".py").is_file() or as_path.is_dir() else node.module)


def load_time_imports(path: Path) -> set[str]:
    """Modules of the project ``path`` imports when it loads: module and class bodies, not function bodies nor
    ``if TYPE_CHECKING:`` blocks (:func:`every_import` reads those too)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                _add_imported(node, found)
            elif isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.ClassDef | ast.With | ast.Try):
                visit(node.body)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text(), str(path)).body)
    return {m for m in found if m.split(".")[0] == "common"}


def every_import(path: Path) -> set[str]:
    """Modules of the project ``path`` imports anywhere: when it loads, in function bodies and in ``if
    TYPE_CHECKING:`` blocks. A cycle through a lazy import is still one (it closes at the first call), and so is
    a cycle through what the annotations name (the type checker and a reader follow it). The registry's imports of
    its slices and halves by name (``importlib``, ``common.methods.registry`` and ``load_half``) are not read:
    they are its plug-in loading, of modules that import it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import | ast.ImportFrom):
            _add_imported(node, found)
    return {m for m in found if m.split(".")[0] == "common"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_common_is_split_by_concern_and_each_concern_imports_only_those_below_it():
    wrong = {}
    for concern, allowed in CONCERNS.items():
        for path in modules(f"common/{concern}"):
            outside = {
                m for m in load_time_imports(path) if m.split(".")[1] not in allowed | {concern} and m != "common"
            }
            if outside:
                wrong[str(path.relative_to(ROOT))] = sorted(outside)
    assert wrong == {}
    flat = sorted(p.name for p in (ROOT / "common").glob("*.py") if p.name != "__init__.py")
    assert flat == [], "common/ holds packages by concern only"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> modules it imports), as a path that ends where it starts."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep in graph and dep not in state and (cycle := visit(dep, [*path, dep])):
                return cycle
        state[name] = 2
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name, [name])):
            return cycle
    return None


def test_no_import_cycle_in_common():
    cycle = find_cycle({module_name(p): every_import(p) for p in modules("common")})
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_reads_load_time_imports_and_finds_a_cycle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from common.b import x\n")
    b.write_text("import common.a\nif TYPE_CHECKING:\n    import common.c\ndef f():\n    import common.d\n")
    graph = {"common.a": load_time_imports(a), "common.b": load_time_imports(b)}
    assert graph == {"common.a": {"common.b"}, "common.b": {"common.a"}}
    assert find_cycle(graph) == ["common.a", "common.b", "common.a"]
    assert find_cycle({"common.a": {"common.b"}, "common.b": set()}) is None
    assert every_import(b) == {"common.a", "common.c", "common.d"}


def test_the_cycle_check_sees_a_circle_closed_by_a_lazy_and_an_annotation_import(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("def f():\n    from common.b import x\n")
    b.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from common.a import y\n")
    assert find_cycle({"common.a": load_time_imports(a), "common.b": load_time_imports(b)}) is None
    assert find_cycle({"common.a": every_import(a), "common.b": every_import(b)}) == [
        "common.a",
        "common.b",
        "common.a",
    ]
