"""The client halves of the prompt-based continual learners: L2P and CODA-Prompt.

The backbone stays ``W0`` (no LoRA, no dense delta); a step trains the plan's prompt
components that are not frozen (``RoundPlan.prompt``, ``prompt_frozen``; ``common/adapters/prompts.py``)
at ``lora_lr`` and the head with ACE at ``lr``, and sends the change of the trained components
(``delta/<name>``) and the head. Every forward first computes the **query** ``q``: the frozen
backbone's features of the unprompted input (eval mode, no gradient): the class token of a ViT,
the mean-pooled states of a text encoder, T5's decoder state. Prompts are prepended to the
embedded tokens (prompt tuning, ``Backbone.prompted``; after the class token in a ViT).

- **L2P** (Wang et al. 2022): each sample takes the ``top_k`` prompts whose keys are the most
  cosine-similar to ``q`` (:func:`l2p_select`), prepended together (``top_k * length`` tokens);
  its features are the mean of the prompt positions' last states (L2P's classifier input;
  ``l2p.features=pooled``: the backbone's own pooling of the prompted sequence), and
  the surrogate loss ``pull * mean_x sum_i (1 - cos(q, k_si))`` draws the chosen keys to the
  queries (:func:`matching_loss`).
- **CODA-Prompt** (Smith et al. 2023): one prompt per sample, ``sum_m alpha_m P_m`` with
  ``alpha_m = cos(q * A_m, K_m)`` (:func:`coda_weights`) over the components so far; the earlier
  tasks' components are constants, the current task's are trained. The features are the
  backbone's own pooling of the prompted sequence. With ``coda.ortho > 0`` the loss adds
  ``ortho * sum ||T T^T - I||^2 / m^2`` over keys, attention and (flattened) prompts.
  CODA-P's original inserts its prompt as a prefix of keys and values in layers 0-4; here it is
  prepended to the input, as L2P's is, on every backbone alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from client.methods.base import Client, ClientMethod, load_head, load_lora, sent_head
from common.adapters.prompts import CODA_ATTENTION, CODA_KEYS, CODA_PROMPTS, L2P_KEYS, L2P_PROMPTS
from common.methods.coda import CodaSettings
from common.methods.l2p import L2pSettings
from common.wire.instructions import Mode, PromptStep
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import PROMPT, pack


def l2p_select(query: Tensor, keys: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    """L2P's query-key matching: per sample, the ``top_k`` keys of highest cosine with its query.

    ``query (batch, F)``, ``keys (pool, F)`` -> indices ``(batch, top_k)`` (most similar first)
    and their cosines ``(batch, top_k)`` (differentiable in the keys)."""
    cosine = F.normalize(query, dim=1) @ F.normalize(keys, dim=1).T  # (batch, pool)
    idx = cosine.detach().topk(top_k, dim=1).indices
    return idx, cosine.gather(1, idx)


def matching_loss(cosines: Tensor) -> Tensor:
    """L2P's surrogate loss ``mean_x sum_i (1 - cos(q(x), k_si))`` of the chosen keys' ``cosines (batch, top_k)``."""
    return (1.0 - cosines).sum(1).mean()


def coda_weights(query: Tensor, keys: Tensor, attention: Tensor) -> Tensor:
    """CODA-P's component weights ``alpha_m = cos(q * A_m, K_m)``.

    ``query (batch, F)``, ``keys (m, F)``, ``attention (m, F)`` -> ``(batch, m)``."""
    attended = F.normalize(query.unsqueeze(1) * attention, dim=2)  # (batch, m, F)
    return torch.einsum("bmf,mf->bm", attended, F.normalize(keys, dim=1))


def ortho_penalty(rows: Tensor) -> Tensor:
    """``||T T^T - I||^2 / m^2`` of ``rows (m, n)``: zero when the rows are orthonormal."""
    eye = torch.eye(rows.shape[0], dtype=rows.dtype, device=rows.device)
    return (rows @ rows.T - eye).square().mean()


class PromptTrainer(ClientMethod):
    """The shared half: the frozen ``W0``, the plan's pool (frozen part constant, the rest trained), the head."""

    mode = Mode.PROMPT

    def load(self, client: Client, plan: RoundPlan) -> None:
        load_lora(client, plan)  # no factors in a prompt plan: W0 itself
        load_head(client.model, plan)
        device, frozen, width = client.device, plan.expect(PromptStep).prompt_frozen, client.model.backbone.feature_dim
        self.frozen: dict[str, Tensor] = {}
        self.trained: dict[str, nn.Parameter] = {}
        self.received: dict[str, Tensor] = {}
        for name, t in plan.named(PROMPT).items():
            if t.shape[-1] != width or not 0 <= frozen <= t.shape[0]:
                raise ValueError(
                    f"prompt {name!r} of shape {tuple(t.shape)} (first {frozen} frozen) does not fit this model: "
                    f"its last dimension must be the backbone's width {width}"
                )
            self.received[name] = t[frozen:].to(torch.float32)
            self.frozen[name] = t[:frozen].to(device=device, dtype=torch.float32)
            self.trained[name] = nn.Parameter(self.received[name].to(device).clone())

    def pool(self, name: str) -> Tensor:
        """The whole pool tensor ``name``: the frozen components, then the trained ones."""
        return torch.cat([self.frozen[name], self.trained[name]])

    def trainable(self, client: Client, plan: RoundPlan) -> list[nn.Parameter]:
        for layer in client.model.lora().values():
            layer.set_trainable(())  # the backbone stays W0: no gradient reaches it
        return list(self.trained.values())

    def query(self, client: Client, inputs: dict[str, Tensor]) -> Tensor:
        """The frozen backbone's features of the unprompted input ``(batch, F)``: eval mode, no gradient."""
        backbone = client.model.backbone
        training = backbone.training
        backbone.eval()
        with torch.no_grad():
            q = backbone(**inputs)
        backbone.train(training)
        return q

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        trained = plan.phase == Phase.TRAIN
        delta = {name: p.detach().cpu() - self.received[name] for name, p in self.trained.items()} if trained else {}
        return pack(delta=delta, head=sent_head(client.model, plan))


class L2pTrainer(PromptTrainer):
    """L2P: the ``top_k`` prompts matched to each sample's query, prepended; features: their positions' mean."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.settings = client.config.section(L2pSettings)
        self.cosines: Tensor | None = None

    def forward(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        model = client.model
        idx, self.cosines = l2p_select(self.query(client, inputs), self.pool(L2P_KEYS), self.settings.top_k)
        prompts = self.pool(L2P_PROMPTS)[idx]  # (batch, top_k, length, F)
        pooled, states = model.backbone.prompted(prompts.flatten(1, 2), **inputs)
        return model.head(states.mean(dim=1) if self.settings.features == "prompts" else pooled)

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if self.settings.pull == 0.0 or self.cosines is None:
            return None
        return self.settings.pull * matching_loss(self.cosines)


class CodaTrainer(PromptTrainer):
    """CODA-Prompt: one prompt per sample, the components weighted by ``cos(q * A_m, K_m)``."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.ortho = client.config.section(CodaSettings).ortho

    def forward(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        model = client.model
        alpha = coda_weights(self.query(client, inputs), self.pool(CODA_KEYS), self.pool(CODA_ATTENTION))
        prompt = torch.einsum("bm,mld->bld", alpha, self.pool(CODA_PROMPTS))  # (batch, length, F)
        features, _ = model.backbone.prompted(prompt, **inputs)
        return model.head(features)

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if self.ortho == 0.0:
            return None
        keys, attention, prompts = self.pool(CODA_KEYS), self.pool(CODA_ATTENTION), self.pool(CODA_PROMPTS)
        return self.ortho * (ortho_penalty(keys) + ortho_penalty(attention) + ortho_penalty(prompts.flatten(1)))
