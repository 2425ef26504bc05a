"""A Llama forward pass over per-sequence KV buffers, written out over the transformers model's own modules.

It does not call ``model(...)``: transformers' Cache API changes between releases, its module
weights and layer functions do not. Every sequence keeps its own KV buffers (one per layer,
``(kv_heads, capacity, head_dim)``), so sequences of any lengths run in one pass: embeddings,
projections and MLPs run batched over all new tokens, attention runs per sequence (no padding, and
no mask in decode). The tests compare its logprobs with a plain ``model(...)`` forward pass.

Besides Llama it runs the decoder-only families of ``farm.llm.families`` whose layers are attention plus
an MLP: Qwen2 (biased projections), Qwen3 and Qwen3-MoE (per-head q/k norms; the MoE block is called as
the layer's ``mlp``), Phi-3 (one fused qkv projection) and Qwen3.5's full-attention layers (a sigmoid
output gate packed with the query). Each attention module's own ``apply_rotary_pos_emb`` handles
partial rotary embeddings.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol

import torch


class KVSequence(Protocol):
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    #: tokens whose KV is already in the buffers
    length: int


def alloc_kv(
    config: Any, capacity: int, keys: list[torch.Tensor], values: list[torch.Tensor], reused: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Fresh per-layer KV buffers for ``capacity`` tokens, the first ``reused`` copied from ``keys``/``values``."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (config.num_key_value_heads, capacity, head_dim)
    new_k = [torch.empty(shape) for _ in range(config.num_hidden_layers)]
    new_v = [torch.empty(shape) for _ in range(config.num_hidden_layers)]
    for layer in range(config.num_hidden_layers if reused else 0):
        new_k[layer][:, :reused] = keys[layer][:, :reused]
        new_v[layer][:, :reused] = values[layer][:, :reused]
    return new_k, new_v


def forward(model: Any, seqs: Sequence[KVSequence], chunks: list[list[int]]) -> torch.Tensor:
    """Feed each sequence its chunk of new tokens and append their KV; returns each sequence's last logits."""
    inner = model.model
    lens = [len(c) for c in chunks]
    ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long)
    pos = torch.tensor([s.length + i for s, n in zip(seqs, lens, strict=True) for i in range(n)])
    hidden = inner.embed_tokens(ids)[None]  # (1, total, hidden): every sequence's tokens in one row
    cos, sin = inner.rotary_emb(hidden, pos[None])
    for layer_idx, layer in enumerate(inner.layers):
        attn = layer.self_attn
        heads = attn.config.num_attention_heads
        q, k, v, gate = _project(attn, layer.input_layernorm(hidden))
        q, k = sys.modules[type(attn).__module__].apply_rotary_pos_emb(q, k, cos, sin)
        outs = []
        start = 0
        for seq, n in zip(seqs, lens, strict=True):
            end = start + n
            kb, vb = seq.keys[layer_idx], seq.values[layer_idx]
            kb[:, seq.length : seq.length + n] = k[0, :, start:end]
            vb[:, seq.length : seq.length + n] = v[0, :, start:end]
            total = seq.length + n
            kk = kb[:, :total].repeat_interleave(attn.num_key_value_groups, dim=0)
            vv = vb[:, :total].repeat_interleave(attn.num_key_value_groups, dim=0)
            outs.append(_attend(q[0, :, start:end], kk, vv, past=seq.length, scale=attn.scaling))
            start = end
        o = torch.cat(outs, dim=1).transpose(0, 1).reshape(1, -1, heads * attn.head_dim)
        if gate is not None:
            o = o * torch.sigmoid(gate)
        hidden = hidden + attn.o_proj(o)
        mlp_out = layer.mlp(layer.post_attention_layernorm(hidden))
        # Some MoE blocks also return their router logits.
        hidden = hidden + (mlp_out[0] if isinstance(mlp_out, tuple) else mlp_out)
    for seq, n in zip(seqs, lens, strict=True):
        seq.length += n
    last = torch.tensor(lens).cumsum(0) - 1
    logits: torch.Tensor = model.lm_head(inner.norm(hidden[0, last])).float()
    return logits


def _project(attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Queries, keys and values, each ``(1, heads, tokens, head_dim)``, and Qwen3.5's output gate (or None)."""
    heads, kv_heads, dim = attn.config.num_attention_heads, attn.config.num_key_value_heads, attn.head_dim
    gate = None
    if hasattr(attn, "qkv_proj"):  # Phi-3
        q, k, v = attn.qkv_proj(x).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    else:
        q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        if q.shape[-1] == 2 * heads * dim:  # Qwen3.5: each head's query followed by its gate
            q, gate = torch.chunk(q.view(1, -1, heads, 2 * dim), 2, dim=-1)
            gate = gate.reshape(1, -1, heads * dim)
    q, k, v = q.reshape(1, -1, heads, dim), k.reshape(1, -1, kv_heads, dim), v.reshape(1, -1, kv_heads, dim)
    if hasattr(attn, "q_norm"):  # Qwen3, Qwen3-MoE, Qwen3.5: RMSNorm over each head
        q, k = attn.q_norm(q), attn.k_norm(k)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), gate


#: query rows attended at once when a prompt extends a cached prefix (bounds the n x total mask).
QUERY_BLOCK = 1024


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, past: int, scale: float) -> torch.Tensor:
    """Causal attention of ``q`` (positions past..past+n) over ``k``/``v`` (positions 0..past+n)."""
    n = q.shape[1]
    if n == 1:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
    if past == 0:
        # A fresh prompt: the fused causal kernel, with no n x n mask in memory.
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    out = []
    for lo in range(0, n, QUERY_BLOCK):
        hi = min(n, lo + QUERY_BLOCK)
        # Query i (absolute position past+i) sees keys 0..past+i.
        mask = torch.ones(hi - lo, past + hi, dtype=torch.bool).tril(diagonal=past + lo)
        out.append(
            torch.nn.functional.scaled_dot_product_attention(
                q[:, lo:hi], k[:, : past + hi], v[:, : past + hi], attn_mask=mask, scale=scale
            )
        )
    return torch.cat(out, dim=1)
