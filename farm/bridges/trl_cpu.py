"""What TRL 1.16's ``AsyncGRPOTrainer`` needs to train on a CPU, and nothing more.

Read in its source (``trl/experimental/async_grpo``), two calls assume CUDA:

1. ``AsyncGRPOTrainer.__init__`` calls ``trl.trainer.utils.get_peak_flops_per_device``, which calls
   ``torch.cuda.get_device_name`` unconditionally: on a CPU build of torch it raises "Torch not
   compiled with CUDA enabled". Its answer only enables MFU metrics, and for a device it does not know
   it returns None (MFU off). ``enable_cpu_training`` gives that None on CPU.
2. The trainer loads the model with ``attn_implementation="tree_fa3"`` (``packing.py``): every packed
   row's attention goes through ``flash_attn_varlen_func`` of the FlashAttention-3 kernel it fetches
   from the Hub (``kernels.get_kernel("kernels-community/flash-attn3")``), a CUDA kernel. The packing
   (a prefix trie per row, each segment attending to its root-to-segment path) is plain PyTorch.
   ``enable_cpu_training`` answers the same call with ``varlen_attention`` below: the same varlen,
   causal (aligned bottom-right, as FlashAttention >= 2.1) attention, written with PyTorch's
   ``scaled_dot_product_attention`` one segment at a time.

What TRL would need upstream: a device check around ``torch.cuda.get_device_name``, and an SDPA
fallback for ``tree_attention`` when CUDA is absent. Everything else (the loss, the packing, the
batchers, the optimizer, weight sync through the protocols) runs unchanged.
"""

from __future__ import annotations

import types
from typing import Any

import torch


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    **_: Any,
) -> torch.Tensor:
    """FlashAttention's ``flash_attn_varlen_func`` on any device: ``q`` (total_q, heads, dim), ``k``/``v``
    (total_k, kv_heads, dim) packed by the cumulative lengths; grouped-query heads are repeated.

    One attention call over the whole row with a block-diagonal mask (segment s's queries see only
    its own keys, causally), not one call per segment: a row holds a segment per sample, and a
    Python loop of small calls made the backward pass ~4x slower here. The mask is total_q x total_k
    booleans, fine for the rows a CPU trains.

    Raises:
        NotImplementedError: a sliding window (TRL passes one only for models that have it)."""
    if window_size != (-1, -1):
        raise NotImplementedError("sliding-window attention has no CPU fallback here")
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    mask = torch.zeros(q.shape[0], k.shape[0], dtype=torch.bool, device=q.device)
    for s in range(len(bounds_q) - 1):
        q0, q1, k0, k1 = bounds_q[s], bounds_q[s + 1], bounds_k[s], bounds_k[s + 1]
        block = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=q.device)
        # Query i (of lq) sees keys up to i + (lk - lq): its path's tokens before it, and itself.
        mask[q0:q1, k0:k1] = block.tril(diagonal=(k1 - k0) - (q1 - q0)) if causal else block
    repeat = q.shape[1] // k.shape[1]
    keys, values = (x.repeat_interleave(repeat, dim=1).transpose(0, 1) for x in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), keys, values, attn_mask=mask, scale=softmax_scale
    )
    return out.transpose(0, 1)


def enable_cpu_training() -> None:
    """Let ``AsyncGRPOTrainer`` run where CUDA is absent (see the module docstring). A no-op where it is
    present: TRL's own kernel and peak-FLOPs lookup are kept."""
    if torch.cuda.is_available():
        return
    import trl.experimental.async_grpo.async_grpo_trainer as trainer_module
    import trl.experimental.async_grpo.packing as packing

    packing._flash_attn = lambda: types.SimpleNamespace(flash_attn_varlen_func=varlen_attention)
    trainer_module.get_peak_flops_per_device = lambda accelerator, dtype: None  # TRL's answer for an unknown device
