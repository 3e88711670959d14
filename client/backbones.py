"""Backbones: feature extractors that map encoded inputs to features ``(batch, feature_dim)``.

Every backbone knows which LoRA target rule fits it (``common.adapters.lora.TARGET_RULES``), how to encode raw
samples (text or images) into input tensors, and how to give per-layer features and prompted features. This module
holds the architectures (a BERT-like encoder, T5, a timm ViT) and the test tokenizer; ``client.backbone_builders``
builds one from a configuration, ``client.classifier`` puts the adapters and a head around it.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn


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
