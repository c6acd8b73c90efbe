"""A rotation of a Llama-style decoder's residual stream (QuaRot / SpinQuant's ``R1``), before
quantization: the float model computes the same, its weights and activations lose their outliers.

The residual stream ``x`` is read only through RMSNorms and written only by the embedding and
the linears that add into it (``o_proj``, ``down_proj``). RMSNorm without its gamma is invariant
under an orthogonal ``R`` (``rms(x R) = rms(x)``), so with every gamma folded into the linears
that read the norm, the whole model runs on ``x R`` instead of ``x``:

- embedding table ``E -> E R``; ``o_proj`` / ``down_proj`` ``W -> R^T W`` (bias ``R^T b``);
- each linear after a norm ``W -> W diag(gamma) R``, the gamma set to ones (the final norm's
  goes into ``lm_head``, which is untied from the embedding table by this);

The rotation spreads each massive channel over all channels: per-row 4-bit weights and one
int16 scale for the residual stream then waste far fewer steps (measured on SmolLM2-135M,
``benchmarks/npu_int16_accuracy.py --only rotation``). ``R`` is a Sylvester Hadamard matrix of
the largest power-of-two order dividing the width, Kronecker a seeded random orthogonal matrix of
the rest, times random signs (SpinQuant learns ``R``; a random Hadamard-like one is its
starting point).

Architecture-specific on purpose (as TICO's ``spin_llama``): it rewrites a transformers model
with Llama's module names (``model.embed_tokens``, ``model.layers[i].{input_layernorm,
self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}``, ``model.norm``,
``lm_head``); anything else is refused with an :class:`~circle_fx.errors.InputError`.
"""
from __future__ import annotations

import math

import torch

from ..errors import InputError


def rotation_matrix(d: int, seed: int = 0) -> torch.Tensor:
    """An orthogonal ``[d, d]`` float64 matrix: Hadamard(2^k) x random orthogonal(d / 2^k), signs."""
    g = torch.Generator().manual_seed(seed)
    p = d & -d  # the largest power of two dividing d
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < p:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    rest, _ = torch.linalg.qr(torch.randn(d // p, d // p, generator=g, dtype=torch.float64))
    signs = torch.where(torch.rand(d, generator=g) < 0.5, -1.0, 1.0).double()
    return (torch.kron((h / math.sqrt(p)).contiguous(), rest.contiguous()) * signs[:, None]).contiguous()


def _parts(model):
    lm = next((m for m in model.modules() if hasattr(m, "lm_head") and hasattr(m, "model")), None)
    base = getattr(lm, "model", None)
    need = ("embed_tokens", "layers", "norm")
    if base is None or not all(hasattr(base, n) for n in need):
        raise InputError("rotate_residual: expected a transformers Llama-style causal LM (model.embed_tokens, "
                         "model.layers, model.norm, lm_head)")
    for i, layer in enumerate(base.layers):
        for path in ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                     "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
            obj = layer
            for part in path.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                raise InputError(f"rotate_residual: model.layers[{i}] has no {path} (a Llama-style layer is needed)")
    return lm, base


def _set(linear: torch.nn.Linear, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    linear.weight = torch.nn.Parameter(weight.to(linear.weight.dtype), requires_grad=False)
    if bias is not None:
        linear.bias = torch.nn.Parameter(bias.to(linear.bias.dtype), requires_grad=False)


@torch.no_grad()
def rotate_residual(model, seed: int = 0) -> torch.Tensor:
    """Rotate ``model``'s residual stream in place (module docstring); returns ``R``. The
    model's outputs are unchanged up to float rounding; new parameter tensors are set (the old
    ones, which another model may share, are not written)."""
    lm, base = _parts(model)
    emb = base.embed_tokens.weight
    r = rotation_matrix(emb.shape[1], seed)

    def after_norm(lin, norm):
        _set(lin, lin.weight.double() * norm.weight.double()[None, :] @ r)

    for layer in base.layers:
        a, m = layer.self_attn, layer.mlp
        for lin in (a.q_proj, a.k_proj, a.v_proj):
            after_norm(lin, layer.input_layernorm)
        for lin in (m.gate_proj, m.up_proj):
            after_norm(lin, layer.post_attention_layernorm)
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight = torch.nn.Parameter(torch.ones_like(norm.weight), requires_grad=False)
        for lin in (a.o_proj, m.down_proj):
            _set(lin, r.T @ lin.weight.double(), None if lin.bias is None else r.T @ lin.bias.double())
    after_norm(lm.lm_head, base.norm)
    base.norm.weight = torch.nn.Parameter(torch.ones_like(base.norm.weight), requires_grad=False)
    base.embed_tokens.weight = torch.nn.Parameter((emb.double() @ r).to(emb.dtype), requires_grad=False)
    if getattr(lm.config, "tie_word_embeddings", False):
        lm.config.tie_word_embeddings = False  # lm_head now holds diag(gamma) R: its own tensor
    return r
