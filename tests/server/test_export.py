"""The exported run loads without this project's code and reproduces our model's outputs.

Producer side: our ``ClassifierModel`` with a random rank-4 adapter as the frozen delta of every
LoRA layer. Consumer side: only transformers / timm + safetensors + torch (and PEFT when it is
installed), starting from the plain base weights.
"""

import json
import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from client.backbone_builders import build_backbone
from client.classifier import build_model, model_spec
from common.run.config import RunConfig
from common.wire.messages import LowRank, ModelSpec
from server.export import export_adapter, export_head, write_metrics

from tolerance import assert_close_to_dtype

K = 4  # adapter rank: two tasks of rank 2


def random_adapter(spec: ModelSpec, seed: int) -> dict[str, LowRank]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: LowRank(
            0.1 * torch.randn(d_out, K, generator=g, dtype=torch.float64),
            0.1 * torch.randn(K, d_in, generator=g, dtype=torch.float64),
        )
        for name, (d_out, d_in) in spec.layers.items()
    }


def ours_with(backbone: str, adapter_scale: float = 1.0):
    """Our model with ``W0 + adapter_scale * B @ A`` in every LoRA layer (current factors off)."""
    model = build_model(RunConfig(backbone=backbone, rank=2, model_seed=3), num_classes=5).eval()
    spec = model_spec(model)
    adapter = random_adapter(spec, seed=7)
    for name, layer in model.lora().items():
        layer.set_extra(adapter_scale * adapter[name].b, adapter[name].a)
        layer.scale = 0.0
    return model, spec, adapter


def base_of(backbone: str) -> torch.nn.Module:
    """The library model with plain W0, exactly as our wrapper started from (same seed)."""
    wrapper = build_backbone(RunConfig(backbone=backbone, model_seed=3))
    return getattr(wrapper, wrapper.export_prefix.rstrip("."))


def add_deltas_by_hand(model: torch.nn.Module, adapter_dir, scale: float = 1.0) -> int:
    """``W += scale * lora_B @ lora_A`` for every pair in the safetensors file; returns the count."""
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    names = sorted({k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in tensors})
    with torch.no_grad():
        for name in names:
            a = tensors[f"base_model.model.{name}.lora_A.weight"]  # (k, d_in)
            b = tensors[f"base_model.model.{name}.lora_B.weight"]  # (d_out, k)
            model.get_submodule(name).weight += scale * b @ a
    return len(names)


def text_inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 512, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def close(got, want):
    # float32 through tiny two-block encoders whose weights were merged (one rounding each) or reloaded:
    # a few rounded sums of the hidden width per block, a few blocks deep
    assert_close_to_dtype(got, want, torch.float32, terms=2 * 4 * 64)


@pytest.fixture(scope="module")
def bert_export(tmp_path_factory):
    """Our BERT model with the adapter, its hidden states, the exported adapter and a saved base."""
    model, spec, adapter = ours_with("tiny-bert")
    root = tmp_path_factory.mktemp("bert")
    base = base_of("tiny-bert")
    for name, layer in model.lora().items():  # the base really is our W0
        assert torch.equal(base.get_submodule(name.removeprefix("encoder.")).weight, layer.base.weight)
    base.save_pretrained(root / "base")
    spec = ModelSpec(spec.layers, spec.feature_dim, spec.num_classes, spec.export_prefix, str(root / "base"))
    out = export_adapter(root / "adapter", adapter, spec, rank_per_task=2)
    with torch.no_grad():
        hidden = model.backbone.encoder(**text_inputs()).last_hidden_state  # (batch, tokens, hidden)
    return out, spec, adapter, hidden


def load_bert(path):
    from transformers import BertModel

    return BertModel.from_pretrained(str(path), add_pooling_layer=False).eval()


def test_adapter_files_follow_peft_layout(bert_export):
    out, spec, adapter, _ = bert_export
    config = json.loads((out / "adapter_config.json").read_text())
    stripped = [n.removeprefix("encoder.") for n in spec.layers]
    assert config["peft_type"] == "LORA" and config["r"] == K and config["lora_alpha"] == K
    assert config["target_modules"] == stripped
    assert config["lora_dropout"] == 0 and config["bias"] == "none" and config["fan_in_fan_out"] is False
    assert config["base_model_name_or_path"] == spec.base_model
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        assert f.metadata()["lorm.tasks"] == "2"
        assert len(list(f.keys())) == 2 * len(stripped)
        for name, short in zip(spec.layers, stripped):
            a = f.get_tensor(f"base_model.model.{short}.lora_A.weight")
            b = f.get_tensor(f"base_model.model.{short}.lora_B.weight")
            assert a.dtype == b.dtype == torch.float32 and a.is_contiguous() and b.is_contiguous()
            assert torch.equal(a, adapter[name].a.float()) and torch.equal(b, adapter[name].b.float())


def test_bert_by_hand_matches_ours(bert_export):
    out, spec, _, hidden = bert_export
    config = json.loads((out / "adapter_config.json").read_text())
    fresh = load_bert(config["base_model_name_or_path"])
    assert add_deltas_by_hand(fresh, out, config["lora_alpha"] / config["r"]) == len(spec.layers)
    with torch.no_grad():
        close(fresh(**text_inputs()).last_hidden_state, hidden)


def test_bert_with_peft_matches_ours(bert_export):
    peft = pytest.importorskip("peft")
    out, spec, _, hidden = bert_export
    model = peft.PeftModel.from_pretrained(load_bert(spec.base_model), str(out)).eval()
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    assert len(wrapped) == len(spec.layers)
    with torch.no_grad():
        close(model(**text_inputs()).last_hidden_state, hidden)
        merged = model.merge_and_unload()
        close(merged(**text_inputs()).last_hidden_state, hidden)


def test_peft_scaling_reproduces_lora_scale(tmp_path):
    peft = pytest.importorskip("peft")
    model, spec, adapter = ours_with("tiny-bert", adapter_scale=0.5)
    export_adapter(tmp_path, adapter, spec, rank_per_task=2, lora_scale=0.5)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["lora_alpha"] == K * 0.5
    loaded = peft.PeftModel.from_pretrained(base_of("tiny-bert"), str(tmp_path)).eval()
    with torch.no_grad():
        want = model.backbone.encoder(**text_inputs()).last_hidden_state
        close(loaded(**text_inputs()).last_hidden_state, want)


def test_vit_by_hand_and_with_peft_match_ours(tmp_path):
    from timm.models.vision_transformer import VisionTransformer

    model, spec, adapter = ours_with("tiny-vit")
    assert spec.export_prefix == "vit."
    save_file(base_of("tiny-vit").state_dict(), str(tmp_path / "base.safetensors"))
    out = export_adapter(tmp_path / "adapter", adapter, spec, rank_per_task=2)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.backbone(pixel_values=pixels)  # (batch, feature_dim): the pre-logits

    def fresh_vit():
        vit = VisionTransformer(
            img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=0
        )
        vit.load_state_dict(load_file(str(tmp_path / "base.safetensors")))
        return vit.eval()

    by_hand = fresh_vit()
    assert add_deltas_by_hand(by_hand, out) == len(spec.layers)
    with torch.no_grad():
        close(by_hand(pixels), want)
    try:
        import peft
    except ImportError:
        return
    with torch.no_grad():
        close(peft.PeftModel.from_pretrained(fresh_vit(), str(out)).eval()(pixels), want)


SPEC = ModelSpec({"enc.l1": (5, 4), "enc.l2": (3, 6)}, feature_dim=4, num_classes=3, export_prefix="enc.")


def small_adapter():
    return {name: LowRank(torch.ones(d_out, 2), torch.ones(2, d_in)) for name, (d_out, d_in) in SPEC.layers.items()}


@pytest.mark.parametrize(
    "breaks, message",
    [
        (lambda ad: ad.pop("enc.l2"), "enc.l2"),
        (lambda ad: ad.update({"enc.l3": LowRank(torch.ones(1, 2), torch.ones(2, 1))}), "enc.l3"),
        (lambda ad: ad.update({"enc.l2": LowRank(torch.ones(3, 2), torch.ones(2, 5))}), r"enc\.l2.*\(2, 5\)"),
        (lambda ad: ad.update({"enc.l1": LowRank(torch.ones(4, 2), torch.ones(2, 4))}), r"enc\.l1.*\(4, 2\)"),
        (lambda ad: ad.update({"enc.l2": LowRank(torch.ones(3, 1), torch.ones(1, 6))}), r"enc\.l2.*rank 1"),
        (lambda ad: ad["enc.l2"].a.__setitem__((0, 0), math.nan), r"enc\.l2.*A.*non-finite"),
        (lambda ad: ad["enc.l1"].b.__setitem__((1, 1), math.inf), r"enc\.l1.*B.*non-finite"),
    ],
)
def test_bad_adapter_is_rejected_naming_the_layer(tmp_path, breaks, message):
    adapter = small_adapter()
    breaks(adapter)
    with pytest.raises(ValueError, match=message):
        export_adapter(tmp_path, adapter, SPEC, rank_per_task=2)
    assert list(tmp_path.iterdir()) == []


def test_rank_must_be_a_multiple_of_rank_per_task(tmp_path):
    with pytest.raises(ValueError, match="rank 2 is not a multiple of rank_per_task 3"):
        export_adapter(tmp_path, small_adapter(), SPEC, rank_per_task=3)


def test_export_head_round_trips(tmp_path):
    w, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    path = export_head(tmp_path, w.T.contiguous().T, b)  # a strided input is stored contiguous
    loaded = load_file(str(path))
    assert path.name == "head.safetensors" and set(loaded) == {"weight", "bias"}
    assert loaded["weight"].dtype == torch.float32
    assert torch.equal(loaded["weight"], w.float()) and torch.equal(loaded["bias"], b.float())
    with pytest.raises(ValueError, match=r"bias \(num_classes,\)"):
        export_head(tmp_path, w, torch.zeros(4))


def test_write_metrics_is_strict_json_and_atomic(tmp_path):
    summary = {"faa": 81.5, "accuracy": [[90.0], [70.0, 93.0]], "forgetting": math.nan, "history": ({"t": 0},)}
    path = write_metrics(tmp_path, summary)
    write_metrics(tmp_path, {**summary, "faa": 82.0})  # replaces the file in place
    assert json.loads(path.read_text()) == {
        "faa": 82.0,
        "accuracy": [[90.0], [70.0, 93.0]],
        "forgetting": None,
        "history": [{"t": 0}],
    }
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]  # no temp files left
    with pytest.raises(TypeError):
        write_metrics(tmp_path, {"bad": object()})
    assert json.loads(path.read_text())["faa"] == 82.0 and len(list(tmp_path.iterdir())) == 1


def test_results_files_get_the_mode_open_gives_not_mkstemps(tmp_path):
    # Results copied out of a container (docker compose cp) keep their mode: 0600 would lock
    # everyone but the copier out, which is what mkstemp alone leaves.
    path = write_metrics(tmp_path, {"faa": 1.0})
    export_head(tmp_path, torch.zeros(2, 3), torch.zeros(2))
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    want = plain.stat().st_mode & 0o777
    assert want & 0o044  # the test's own umask lets group or others read
    assert path.stat().st_mode & 0o777 == want
    assert (tmp_path / "head.safetensors").stat().st_mode & 0o777 == want


def test_dense_delta_keys_are_the_library_models_state_dict(tmp_path):
    """Full fine-tuning baselines export W - W0 under the transformers model's own names."""
    from server.export import export_dense_delta

    cfg = RunConfig(backbone="tiny-bert", rank=1, model_seed=3)
    spec = model_spec(build_model(cfg, num_classes=5))
    delta = {n: torch.full(shape, 0.5) for n, shape in spec.params.items()}
    path = export_dense_delta(tmp_path / "delta.safetensors", delta, spec)
    bert = build_backbone(cfg).encoder  # the plain transformers BertModel
    state = bert.state_dict()
    exported = load_file(str(path))
    assert set(exported) <= set(state) and len(exported) == len(spec.params)
    assert "encoder.layer.0.attention.self.query.weight" in exported
    for key, t in exported.items():
        assert t.shape == state[key].shape
    with pytest.raises(ValueError, match="missing parameter"):
        export_dense_delta(tmp_path / "d.safetensors", {}, spec)
