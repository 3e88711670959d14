"""The committed protobuf stubs are exactly what proto/generate.py makes of proto/lorm.proto."""

import shutil

from proto import generate


def test_committed_stubs_are_fresh():
    diffs = generate.stale_stubs()

    assert not diffs, "stale proto stubs; run `python proto/generate.py`:\n" + "".join(diffs)


def test_check_flag_exits_zero_when_fresh(capsys):
    assert generate.main(["--check"]) == 0


def test_check_detects_an_edited_proto(tmp_path, monkeypatch):
    shutil.copytree(generate.ROOT / "proto", tmp_path / "proto", ignore=shutil.ignore_patterns("__pycache__"))
    proto = tmp_path / "proto" / "lorm.proto"
    field = "string metrics_json = 8;"
    proto.write_text(proto.read_text().replace(field, field + "\n  int32 extra = 9;"))
    monkeypatch.setattr(generate, "ROOT", tmp_path)

    diffs = generate.stale_stubs()

    assert diffs and any("extra" in diff for diff in diffs)
    assert generate.main(["--check"]) == 1


def test_grpc_module_imports_messages_package_relative():
    source = (generate.ROOT / "proto" / "lorm_pb2_grpc.py").read_text()

    assert "from proto import lorm_pb2 as" in source
    assert generate._fix_grpc_import("import grpc\nimport lorm_pb2 as lorm__pb2\n") == (
        "import grpc\nfrom proto import lorm_pb2 as lorm__pb2\n"
    )
