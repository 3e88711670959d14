"""LoRA layer, Gram capture and LoRA placement."""

import math

import pytest
import torch
from torch import nn

from common.adapters.lora import GramRecorder, LoRALinear, apply_lora, init_lora_a, lora_layers

from tolerance import assert_close_to_dtype


def make_layer(d_in=6, d_out=5, r=2, seed=0):
    torch.manual_seed(seed)
    layer = LoRALinear(nn.Linear(d_in, d_out), rank=r)
    with torch.no_grad():
        layer.lora_B.normal_()
    return layer


@pytest.mark.parametrize("shape", [(7, 6), (3, 4, 6)])
def test_output_is_w0x_plus_bax(shape):
    layer = make_layer()
    x = torch.randn(*shape)
    w0, b0 = layer.base.weight, layer.base.bias
    expected = x @ w0.T + b0 + x @ (layer.lora_B @ layer.lora_A).T
    assert_close_to_dtype(layer(x), expected, torch.float32, terms=6 + 2 + 3)  # the widest sums: d_in, r, k


def test_extra_delta_and_scale():
    layer = make_layer()
    be, ae = torch.randn(5, 3), torch.randn(3, 6)
    layer.set_extra(be, ae)
    layer.scale = 0.5
    x = torch.randn(4, 6)
    expected = layer.base(x) + 0.5 * x @ (layer.lora_B @ layer.lora_A).T + x @ (be @ ae).T
    assert_close_to_dtype(layer(x), expected, torch.float32, terms=6 + 2 + 3)  # the widest sums: d_in, r, k
    torch.testing.assert_close(layer.delta(), 0.5 * layer.lora_B @ layer.lora_A + be @ ae)
    layer.set_extra(None, None)
    layer.scale = 0.0
    torch.testing.assert_close(layer(x), layer.base(x))


def test_init_b_zero_a_kaiming_uniform():
    layer = LoRALinear(nn.Linear(400, 3), rank=4)
    assert torch.count_nonzero(layer.lora_B) == 0
    bound = 1 / math.sqrt(400)
    assert layer.lora_A.abs().max() <= bound
    assert layer.lora_A.abs().max() > 0.9 * bound  # really spread over the range
    x = torch.randn(2, 400)
    torch.testing.assert_close(layer(x), layer.base(x))


@pytest.mark.parametrize("active", ["A", "B"])
def test_exactly_one_factor_trains(active):
    layer = make_layer()
    layer.set_trainable((active,))
    trainable = {n for n, p in layer.named_parameters() if p.requires_grad}
    assert trainable == {f"lora_{active}"}
    layer(torch.randn(3, 6)).sum().backward()
    other = "B" if active == "A" else "A"
    assert getattr(layer, f"lora_{active}").grad is not None
    assert getattr(layer, f"lora_{other}").grad is None
    assert layer.base.weight.grad is None


def test_bad_factor_shapes_name_both():
    layer = make_layer()
    with pytest.raises(ValueError, match=r"B \(5, 2\).*got B \(5, 3\)"):
        layer.load_factors(torch.zeros(5, 3), torch.zeros(3, 6))
    with pytest.raises(ValueError, match="positive integer"):
        LoRALinear(nn.Linear(3, 3), rank=0)


@pytest.mark.parametrize("shape", [(9, 6), (2, 5, 6)])
@pytest.mark.parametrize("full", [False, True])
def test_gram_recorder_equals_xtx(shape, full):
    layer = make_layer()
    x1, x2 = torch.randn(*shape), torch.randn(*shape)
    recorder = GramRecorder({"l": layer}, full=full)
    with recorder.recording():
        layer(x1)
        layer(x2)
    layer(torch.randn(*shape))  # outside the context: not recorded
    rows = torch.cat([x1.reshape(-1, 6), x2.reshape(-1, 6)]).double()
    expected = rows.T @ rows if full else (rows * rows).sum(0)
    assert recorder.grams["l"].dtype == torch.float64
    torch.testing.assert_close(recorder.grams["l"], expected)
    assert recorder.rows["l"] == rows.shape[0]
    assert not layer._forward_pre_hooks


def test_apply_lora_bert_rules_and_identity_at_init():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(
        BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32),
        add_pooling_layer=True,
    ).eval()
    ids = torch.randint(0, 50, (2, 5))
    before = model(input_ids=ids).last_hidden_state
    names = apply_lora(model, "bert", rank=2)
    suffixes = [
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "intermediate.dense",
        "output.dense",
    ]
    assert names == [f"encoder.layer.{i}.{s}" for i in range(2) for s in suffixes]
    assert set(lora_layers(model)) == set(names)
    assert "pooler.dense" not in names
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == []  # nothing trains until a factor is switched on
    torch.testing.assert_close(model(input_ids=ids).last_hidden_state, before)


def test_apply_lora_vit_rules():
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=3)
    names = apply_lora(vit, "vit", rank=1)
    assert names == [f"blocks.{i}.{s}" for i in range(2) for s in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")]
    assert not isinstance(vit.head, LoRALinear)


def test_apply_lora_t5_rules():
    from transformers import T5Config, T5ForConditionalGeneration

    t5 = T5ForConditionalGeneration(
        T5Config(vocab_size=40, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2)
    )
    linear = [n for n, m in t5.named_modules() if isinstance(m, nn.Linear)]
    names = apply_lora(t5, "t5", rank=1)
    assert "lm_head" in linear and "lm_head" not in names
    assert sorted(names) == sorted(n for n in linear if n != "lm_head")
    assert any("EncDecAttention" in n for n in names)  # cross-attention too


def test_apply_lora_rejects_no_match():
    with pytest.raises(ValueError, match="no nn.Linear layer matched"):
        apply_lora(nn.Sequential(nn.Linear(2, 2)), ["nothing"], rank=1)


def test_init_lora_a_is_seeded():
    a1 = init_lora_a(3, 10, torch.Generator().manual_seed(5))
    a2 = init_lora_a(3, 10, torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2)


def test_gram_recorder_leaves_masked_rows_out():
    layer = make_layer()
    x = torch.randn(2, 4, 6)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    recorder = GramRecorder({"l": layer}, full=True)
    recorder.row_mask = mask
    with recorder.recording():
        layer(x)
    rows = x[mask.bool()].double()  # 5 real tokens
    torch.testing.assert_close(recorder.grams["l"], rows.T @ rows)
    assert recorder.rows["l"] == 5
