"""attn_varlen_func (flash_attn_varlen_func's convention) on CPU tensors: every sequence equals
attn_func on that sequence alone, bit for bit; empty sequences; causal with s_q > s_k; the LSE
layout; bad offsets."""

import pytest
import torch

import fp4attn


def _packed(lengths, heads, d, seed):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    x = torch.randn(total, heads, d, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return x, cu


@pytest.mark.parametrize("causal", [False, True])
def test_each_sequence_equals_attn_func_alone(causal):
    len_q, len_k = [17, 0, 70, 5], [33, 8, 0, 40]
    q, cu_q = _packed(len_q, 4, 64, 0)
    k, cu_k = _packed(len_k, 2, 64, 1)
    v, _ = _packed(len_k, 2, 64, 2)
    o, lse = fp4attn.attn_varlen_func(
        q, k, v, cu_q, cu_k, max(len_q), max(len_k), causal=causal, recipe="fp8", return_lse=True
    )
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (4, sum(len_q)) and lse.dtype == torch.float32
    for i in range(len(len_q)):
        q0, q1, k0, k1 = cu_q[i], cu_q[i + 1], cu_k[i], cu_k[i + 1]
        if q1 == q0:
            continue
        ref, ref_lse = fp4attn.attn_func(
            q[None, q0:q1],
            k[None, k0:k1],
            v[None, k0:k1],
            causal=causal,
            recipe="fp8",
            return_lse=True,
        )
        assert torch.equal(o[q0:q1], ref[0]), f"sequence {i}"
        assert torch.equal(lse[:, q0:q1], ref_lse[0]), f"sequence {i}"
    # The sequence with no keys: O = 0, LSE = +inf.
    assert torch.all(o[cu_q[2] : cu_q[3]] == 0)
    assert torch.all(torch.isinf(lse[:, cu_q[2] : cu_q[3]]))


def test_bad_offsets_name_the_argument():
    q, cu = _packed([8, 8], 4, 64, 0)
    with pytest.raises(ValueError, match="^cu_seqlens_q: must start at 0"):
        fp4attn.attn_varlen_func(q, q, q, cu + 1, cu)
    with pytest.raises(ValueError, match="^cu_seqlens_k: offsets must not decrease"):
        fp4attn.attn_varlen_func(q, q, q, cu, torch.tensor([0, 9, 8], dtype=torch.int32))
    with pytest.raises(ValueError, match="^cu_seqlens_q: last offset 17 exceeds"):
        fp4attn.attn_varlen_func(q, q, q, torch.tensor([0, 8, 17], dtype=torch.int32), cu)
    with pytest.raises(TypeError, match="^cu_seqlens_q: expected int32"):
        fp4attn.attn_varlen_func(q, q, q, cu.float(), cu)
    with pytest.raises(ValueError, match="^cu_seqlens_k: 1 sequences"):
        fp4attn.attn_varlen_func(q, q, q, cu, torch.tensor([0, 16], dtype=torch.int32))
    with pytest.raises(ValueError, match="^max_seqlen_q: 4 is shorter"):
        fp4attn.attn_varlen_func(q, q, q, cu, cu, max_seqlen_q=4)
    with pytest.raises(ValueError, match="^q: expected rank 3"):
        fp4attn.attn_varlen_func(q[None], q, q, cu, cu)
