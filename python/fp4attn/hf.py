"""Hugging Face transformers integration: `fp4attn.hf.register()` adds "fp4attn" as an
`attn_implementation` (transformers' AttentionInterface), so a model switches to fp4attn with

    fp4attn.hf.register()                  # the default recipe (fp4attn.set_default_recipe)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="fp4attn")

Padding masks, sliding windows, softcapping, dropout, attention sinks (gpt-oss's `s_aux`) and
packed sequences (`cu_seq_lens_q` / `cu_seq_lens_k`) are refused with UnsupportedError rather than
ignored: the result would silently differ from the model's definition otherwise.
"""

from __future__ import annotations

from . import _defaults
from ._native import UnsupportedError
from .api import attn_func


def _attention(recipe: str):
    def forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        # query [b, h, s_q, d], key/value [b, h_kv, s_k, d]: transformers' layout is bhsd.
        if attention_mask is not None:
            raise UnsupportedError(
                "attention_mask: fp4attn supports causal or full attention over unpadded batches "
                "only (this batch has padding or a custom mask)"
            )
        for name in ("sliding_window", "softcap"):
            if kwargs.get(name) is not None:
                raise UnsupportedError(f"{name}: not supported by fp4attn")
        if kwargs.get("s_aux") is not None:
            raise UnsupportedError(
                "s_aux: attention sinks (one extra logit per head in the softmax) are not "
                "supported by fp4attn yet"
            )
        for name in ("cu_seq_lens_q", "cu_seq_lens_k"):
            if kwargs.get(name) is not None:
                raise UnsupportedError(
                    f"{name}: packed sequences are not supported by the transformers adapter "
                    "(each token would attend across documents); use fp4attn.attn_varlen_func"
                )
        if dropout:
            raise UnsupportedError(
                "dropout: attention dropout is not supported by fp4attn; got "
                f"{dropout} (is the model in training mode with attention_dropout > 0?)"
            )
        causal = kwargs.get("is_causal")
        causal = getattr(module, "is_causal", True) if causal is None else bool(causal)
        o = attn_func(
            query, key, value, softmax_scale=scaling, causal=causal, recipe=recipe, layout="bhsd"
        )
        return o.transpose(1, 2), None  # [b, s_q, h, d], contiguous (see attn_func)

    return forward


def register(name: str = "fp4attn", recipe: str | None = None) -> str:
    """Registers attention (and its mask function) under `name` for `recipe` (None: the default
    recipe at each call, fp4attn.set_default_recipe / use_recipe); returns `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    if recipe is not None:
        _defaults.resolve(recipe)  # checked now, not at the first forward
    AttentionInterface.register(name, _attention(recipe))
    # FlashAttention's mask function gives None for unpadded batches and the 2-D padding mask
    # otherwise, which forward() then refuses.
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


__all__ = ["register"]
