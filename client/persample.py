"""Each sample's squared gradient, summed, from one batched forward and backward pass.

A diagonal Fisher (``client.methods.dense.fisher``) sums ``w_b g_b^2`` over samples ``b``, where
``g_b`` is the gradient of sample ``b``'s own scalar (``log p(y_b | x_b)``). One backward pass per
sample gives it, at the latency of many small kernels. Here the batch runs once: a forward hook keeps
each parameter-owning layer's input ``x`` and output, the backward pass asks for the gradients ``d``
of those outputs only (no weight gradient is formed), and each sample's weight gradient is rebuilt
from its own rows (its samples do not mix: the layers act per token, attention is masked and the
pooling leaves padding out), as for these layers it is exactly:

- ``nn.Linear``: ``G_b = sum_t d_bt x_bt^T`` (tokens ``t``), bias ``sum_t d_bt``;
- ``nn.LayerNorm``: ``sum_t d_bt * xhat_bt`` with ``xhat`` the normalised input, bias ``sum_t d_bt``;
- ``nn.Embedding``: row ``v`` gets ``sum_{t: id_bt = v} d_bt`` (never the padding row, as PyTorch);
- ``nn.Conv2d`` (one group, zero padding): a linear layer over its input's patches (``F.unfold``), each output
  position a token: ``G_b = sum_p d_bp x_bp^T``, viewed as the kernel's shape; bias ``sum_p d_bp``;
- a timm ``VisionTransformer``'s own parameters (class and register tokens, position embedding): added to the
  patch tokens, so with ``d`` the gradient of the position-embedded tokens (what ``pos_drop`` receives, the layer
  *tapped* in its stead), each sample's gradient is its own rows of ``d``.

Equal to the per-sample loop up to float rounding (the order of the sums differs), which
``tests/client/test_persample.py`` checks on every parameter. A layer of another kind that owns a
parameter, one that shares a weight with another layer (tied embeddings), or one used twice in a
forward pass, is refused by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Squares = Callable[[nn.Module, dict[str, str], Tensor, Tensor, dict[str, Tensor]], None]


class PerSampleGradients:
    """Hooks on the layers that own the parameters ``params``: what a forward pass recorded inside
    :meth:`recording` needs to rebuild each sample's gradient of them (each layer's input and output, and
    :meth:`output_grads`); :meth:`rule` names, per kind of layer, what is made of them (a subclass's)."""

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter]) -> None:
        names = {id(p): n for n, p in params.items()}
        self.layers: dict[nn.Module, tuple[dict[str, str], Any]] = {}  # layer -> its params' names, rule
        self.taps: dict[nn.Module, nn.Module] = {}  # layer -> the module whose input is the layer's result
        refused: list[str] = []
        found: set[str] = set()  # names of the parameters met in a layer so far
        for path, module in model.named_modules():
            own = {a: names[id(p)] for a, p in module.named_parameters(recurse=False) if id(p) in names}
            if not own:
                continue
            rule = self.rule(module)
            if rule is None or found & set(own.values()):  # another kind of layer, or a weight shared
                refused.append(f"{path or 'the model'} ({type(module).__name__})")
            else:
                self.layers[module] = own, rule
                if (site := tap(module)) is not None:
                    self.taps[module] = site
            found |= set(own.values())
        missing = sorted(set(params) - found)
        if refused or missing:
            raise ValueError(
                f"per-sample gradients from a batch cover the parameters of {self.covered}; "
                + (
                    f"these own parameters of another kind of layer or share a weight: {', '.join(refused)}"
                    if refused
                    else f"not in the model: {missing}"
                )
                + self.instead
            )
        self.params = params
        self.batch = 0
        self.seen: list[tuple[nn.Module, Tensor, Tensor]] = []
        self.reached: set[int] = set()  # the layers (ids) the last output_grads' scalar reached

    covered = "nn.Linear, nn.LayerNorm, plain nn.Embedding and nn.Conv2d layers, and a timm ViT's tokens"
    instead = ""  # what to do instead, when a layer is not covered

    def rule(self, module: nn.Module) -> Any:
        """What this kind of per-sample result is made of for ``module``'s layer kind; ``None``: not covered."""
        raise NotImplementedError

    @contextmanager
    def recording(self, batch: int) -> Iterator[None]:
        """Keep every layer's input and output of the forward pass run inside, for ``batch`` samples."""
        self.batch, self.seen = batch, []
        handles = [
            self.taps[module].register_forward_hook(partial(self._tapped, module))
            if module in self.taps
            else module.register_forward_hook(self._keep)
            for module in self.layers
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
        used = [id(m) for m, _, _ in self.seen]
        ran = set(used)
        if len(ran) != len(used):
            raise ValueError("a layer ran twice in one forward pass: its per-sample gradient is not its rows' sum")
        missed = [type(m).__name__ for m in self.taps if id(m) not in ran]
        if missed and ran:  # its parameters took part, their per-sample gradients unseen: a clip would miss them
            raise ValueError(
                f"{missed[0]}'s position-embedded tokens did not pass its pos_drop in this forward pass, where its "
                "per-sample gradients are read (another timm layout?)"
            )

    def _keep(self, module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor | None:
        x, shared = args[0], output.shape[0] != self.batch
        if shared:  # one output for the whole batch (BERT's position ids, (1, tokens))
            if output.shape[0] != 1:
                raise ValueError(f"{type(module).__name__} output {tuple(output.shape)} is not per sample")
            output = output.expand(self.batch, *output.shape[1:])  # each sample's own gradient of it
            x = x.expand(self.batch, *x.shape[1:])
        self.seen.append((module, x, output))
        return output if shared else None

    def _tapped(self, layer: nn.Module, site: nn.Module, args: tuple[Any, ...], output: Tensor) -> None:
        """``layer``'s result is ``site``'s input (a ViT's position-embedded tokens, entering its ``pos_drop``)."""
        if args[0].shape[0] != self.batch:
            raise ValueError(f"{type(layer).__name__} tokens {tuple(args[0].shape)} are not per sample")
        self.seen.append((layer, args[0], args[0]))

    def output_grads(self, scalar: Tensor, retain: bool) -> list[tuple[tuple[nn.Module, Tensor, Tensor], Tensor]]:
        """The recorded layers with ``d scalar / d output`` of each (layers the scalar does not reach left out)."""
        outputs = [out for _, _, out in self.seen]
        grads = torch.autograd.grad(scalar, outputs, retain_graph=retain, allow_unused=True)
        reached = [(seen, d) for seen, d in zip(self.seen, grads) if d is not None]
        self.reached = {id(module) for (module, _, _), _ in reached}
        return reached

    def unread(self) -> list[str]:
        """The parameters that hold a gradient (after a backward pass of the last :meth:`output_grads`' scalar)
        from a layer whose per-sample rows were not read: a layer never called as a module (``F.linear`` on its
        weight, say), so its hook never fired. Their share of each sample's gradient escaped the per-sample results.
        (A layer called both as a module and around it is not caught here.)"""
        return [
            name
            for module, (own, _) in self.layers.items()
            if id(module) not in self.reached
            for name in own.values()
            if (grad := self.params[name].grad) is not None and bool(grad.any())
        ]


class PerSampleSquares(PerSampleGradients):
    """Adds ``sum_b w_b g_b^2`` of every parameter in ``params`` to ``into[name]`` (shaped like it).

    Use: ``with squares.recording(batch): out = model(inputs)``, then :meth:`add` once per scalar
    ``sum_b s_b`` of that forward pass (``retain`` to ask again of the same pass).
    """

    instead = "; use fisher_batch=1 (a backward pass per sample)"

    def __init__(self, model: nn.Module, params: dict[str, nn.Parameter], into: dict[str, Tensor]) -> None:
        super().__init__(model, params)
        self.into = into

    def rule(self, module: nn.Module) -> Any:
        return squares_of(module)

    def add(self, scalar: Tensor, weights: Tensor, retain: bool = False) -> None:
        """Add ``sum_b weights[b] * (d s_b / d theta)^2`` for ``scalar = sum_b s_b`` (``weights >= 0``)."""
        root = weights.detach().sqrt()
        for (module, x, _), d in self.output_grads(scalar, retain):
            d = d.detach() * root.to(d.dtype).view(-1, *([1] * (d.dim() - 1)))  # sqrt(w_b) g_b, squared: w_b g_b^2
            own, rule = self.layers[module]
            rule(module, own, x.detach(), d, self.into)


def _add_squares(acc: Tensor, per_sample: Tensor) -> None:
    """``acc += sum_b per_sample[b]^2``, ``per_sample (batch, *acc.shape)``."""
    acc.add_(per_sample.square().sum(0))


def tokens(t: Tensor) -> Tensor:
    """``(batch, ..., features) -> (batch, tokens, features)``."""
    return t.reshape(t.shape[0], -1, t.shape[-1])


def linear_rows(d: Tensor, x: Tensor) -> Tensor:
    """``(batch, out, in)``: each sample's ``sum_t d_bt x_bt^T`` of ``d: (batch, tokens, out)``, ``x: (batch, tokens,
    in)``."""
    return torch.bmm(d.transpose(1, 2), x)


def _linear(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, into: dict[str, Tensor]) -> None:
    x, d = tokens(x).to(d.dtype), tokens(d)  # (batch, tokens, in), (batch, tokens, out)
    if "weight" in own:
        acc = into[own["weight"]]
        if x.shape[1] == 1:  # one row a sample: (d x^T)^2 = d^2 (x^2)^T
            acc.addmm_(d[:, 0].square().T, x[:, 0].square())
        else:  # a sample at a time: its (out, in) gradient stays in cache while it is squared and added
            # (all samples' gradients at once, then squared and summed, ran 5x slower on a CPU thread)
            g, rows = torch.empty_like(acc), d.transpose(1, 2)
            for b in range(x.shape[0]):
                torch.mm(rows[b], x[b], out=g)
                acc.addcmul_(g, g)
    if "bias" in own:
        _add_squares(into[own["bias"]], d.sum(1))


def layer_norm_rows(module: nn.Module, x: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """Each sample's gradient of a layer norm's weight and of its bias, ``(batch, *normalized)`` each."""
    assert isinstance(module, nn.LayerNorm)
    shape = module.normalized_shape
    xhat = F.layer_norm(x.to(d.dtype), shape, eps=module.eps)  # without its own weight and bias
    flat = (d.shape[0], -1, *shape)  # (batch, tokens, *normalized)
    return (d * xhat).reshape(flat).sum(1), d.reshape(flat).sum(1)


def _layer_norm(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, into: dict[str, Tensor]) -> None:
    weight, bias = layer_norm_rows(module, x, d)
    if "weight" in own:
        _add_squares(into[own["weight"]], weight)
    if "bias" in own:
        _add_squares(into[own["bias"]], bias)


def embedding_rows(module: nn.Module, ids: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """Each sample's gradient of an embedding, by the rows it touches: the ``(sample, row)`` pairs as ``sample x
    rows + row``, ``(pairs,)``, and each pair's gradient row, ``(pairs, dim)``."""
    assert isinstance(module, nn.Embedding)
    rows, dim = module.num_embeddings, d.shape[-1]
    ids = ids.reshape(ids.shape[0], -1)  # (batch, tokens)
    d = d.reshape(ids.shape[0], -1, dim)
    if module.padding_idx is not None:  # PyTorch leaves the padding row's gradient at zero
        d = d * (ids != module.padding_idx).unsqueeze(-1).to(d.dtype)
    samples = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
    keys, where = torch.unique((ids + rows * samples).flatten(), return_inverse=True)  # (sample, row) pairs
    return keys, d.new_zeros(keys.numel(), dim).index_add_(0, where, d.reshape(-1, dim))


def _embedding(module: nn.Module, own: dict[str, str], ids: Tensor, d: Tensor, into: dict[str, Tensor]) -> None:
    keys, per_row = embedding_rows(module, ids, d)
    rows = into[own["weight"]].shape[0]
    into[own["weight"]].index_add_(0, keys % rows, per_row.square_())


def conv_tokens(module: nn.Module, x: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """A covered ``nn.Conv2d`` as a linear layer over patches: its input's patches ``(batch, positions, in * kh *
    kw)`` (``F.unfold``, in the order of the kernel's flattened rows) and ``d (batch, positions, out)``."""
    assert isinstance(module, nn.Conv2d)
    padding = 0 if isinstance(module.padding, str) else module.padding  # "valid" ("same" is not covered)
    patches = F.unfold(x.to(d.dtype), module.kernel_size, module.dilation, padding, module.stride)
    return patches.transpose(1, 2), d.flatten(2).transpose(1, 2)


def _flat_kernel(own: dict[str, str], into: dict[str, Tensor]) -> dict[str, Tensor]:
    """``into`` with a kernel's accumulator viewed ``(out, in * kh * kw)``: a linear layer's."""
    return into | ({own["weight"]: into[own["weight"]].flatten(1)} if "weight" in own else {})


def _conv(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, into: dict[str, Tensor]) -> None:
    _linear(module, own, *conv_tokens(module, x, d), _flat_kernel(own, into))


VIT_TOKENS = ("cls_token", "reg_token", "pos_embed")  # a timm VisionTransformer's own parameters


def vit_rows(module: nn.Module, own: dict[str, str], d: Tensor) -> dict[str, Tensor]:
    """Each sample's gradient of a ViT's own parameters in ``own`` (by name), ``(batch, *param.shape[1:])``, from
    ``d (batch, tokens, dim)``, the gradient of its position-embedded tokens: the class token, then the register
    tokens, then the patches; the position embedding spans them all, or the patches only (``no_embed_class``)."""
    vit: Any = module  # nn.Module.__getattr__ would type its attributes Tensor | Module
    classes, prefix = int(vit.cls_token is not None), int(vit.num_prefix_tokens)
    spans = {"cls_token": (0, classes), "reg_token": (classes, prefix)}
    spans["pos_embed"] = (prefix if vit.no_embed_class else 0, d.shape[1])
    return {own[name]: d[:, spans[name][0] : spans[name][1]] for name in own}


def _vit(module: nn.Module, own: dict[str, str], x: Tensor, d: Tensor, into: dict[str, Tensor]) -> None:
    for name, rows in vit_rows(module, own, d).items():
        _add_squares(into[name], rows.reshape(rows.shape[0], *into[name].shape))


def tap(module: nn.Module) -> nn.Module | None:
    """The module whose input is ``module``'s per-sample result, where it is not ``module``'s output: a ViT's
    ``pos_drop`` (its position-embedded tokens); ``None`` for the other layers."""
    site = module.pos_drop if _is_vit(module) else None
    assert site is None or isinstance(site, nn.Module)
    return site


def _is_vit(module: nn.Module) -> bool:
    """A timm VisionTransformer whose own parameters are only its tokens, with a fixed position embedding (not
    resampled to the image: ``dynamic_img_size``). Imported here only: a text model never reaches it."""
    if not any(c.__module__.startswith("timm.") for c in type(module).__mro__):
        return False
    from timm.models.vision_transformer import VisionTransformer

    own = {name for name, _ in module.named_parameters(recurse=False)}
    return (
        isinstance(module, VisionTransformer)
        and not module.dynamic_img_size
        and isinstance(getattr(module, "pos_drop", None), nn.Module)
        and own <= set(VIT_TOKENS)
    )


def layer_rule(module: nn.Module, linear: Any, layer_norm: Any, embedding: Any, conv: Any, vit: Any) -> Any:
    """The one of ``linear``, ``layer_norm``, ``embedding``, ``conv`` and ``vit`` for ``module``'s kind of layer, or
    ``None`` for a layer the per-sample rebuild does not cover (an embedding whose gradient PyTorch rescales,
    renormalises or makes sparse, a grouped convolution or one that pads other than with zeros, among them)."""
    if isinstance(module, nn.Linear):
        return linear
    if isinstance(module, nn.LayerNorm):
        return layer_norm
    if isinstance(module, nn.Embedding):
        plain = module.max_norm is None and not module.scale_grad_by_freq and not module.sparse
        return embedding if plain else None
    if isinstance(module, nn.Conv2d):
        plain = module.groups == 1 and module.padding_mode == "zeros" and module.padding != "same"
        return conv if plain else None
    return vit if _is_vit(module) else None


def squares_of(module: nn.Module) -> Squares | None:
    """The rule that adds ``module``'s per-sample squares, or ``None`` for a layer it does not cover."""
    rule: Squares | None = layer_rule(module, _linear, _layer_norm, _embedding, _conv, _vit)
    return rule
