"""The SDPA and sageattn shims on an sm_90a GPU: bit for bit against attn_func, with no host
sync (torch.cuda.set_sync_debug_mode("error") around every fp4attn call), and the CUDA
fallbacks against torch's own function."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import fp4attn
from fp4attn import sage, sdpa

pytestmark = [
    pytest.mark.skipif(not fp4attn.cuda_available(), reason="needs a GPU and a CUDA build"),
    pytest.mark.usefixtures("hopper"),  # conftest.py: skips unless the device runs the engine
]

TORCH_SDPA = torch._C._nn.scaled_dot_product_attention


@contextlib.contextmanager
def no_sync():
    """A host sync inside the block raises (compare results after it: comparing syncs)."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@pytest.fixture(autouse=True)
def _fresh():
    sdpa.reset_counts()
    before = F.scaled_dot_product_attention
    yield
    F.scaled_dot_product_attention = before


def bhsd(b=2, h=4, s_q=256, s_k=None, h_kv=None, d=128, dtype=torch.bfloat16, k_mean=0.0):
    g = torch.Generator().manual_seed(0)
    s_k = s_q if s_k is None else s_k
    h_kv = h if h_kv is None else h_kv

    def make(heads, s, shift=0.0):
        return (torch.randn(b, heads, s, d, generator=g) + shift).to(dtype).cuda()

    return make(h, s_q), make(h_kv, s_k, k_mean), make(h_kv, s_k)


def counted(**expected) -> dict[str, int]:
    return {"calls": 0, **dict.fromkeys(sdpa.REASONS, 0), **expected}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_bit_for_bit(dtype, recipe, d, is_causal):
    q, k, v = bhsd(h=4, h_kv=2, d=d, dtype=dtype)
    with no_sync():
        o = sdpa.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, enable_gqa=True, recipe=recipe
        )
        want = fp4attn.attn_func(q, k, v, causal=is_causal, recipe=recipe, layout="bhsd")
    assert o.shape == q.shape and o.dtype == dtype
    assert torch.equal(o, want)
    assert sdpa.fallback_counts() == counted(calls=1)


@pytest.mark.parametrize("s_q, s_k", [(128, 384), (384, 128)])
def test_sdpa_causal_top_left(s_q, s_k):
    q, k, v = bhsd(s_q=s_q, s_k=s_k)
    with no_sync():
        o = sdpa.scaled_dot_product_attention(q, k, v, is_causal=True)
        if s_q < s_k:
            want = fp4attn.attn_func(q, k[:, :, :s_q], v[:, :, :s_q], causal=True, layout="bhsd")
        else:
            head = fp4attn.attn_func(q[:, :, :s_k], k, v, causal=True, layout="bhsd")
            want = torch.cat((head, fp4attn.attn_func(q[:, :, s_k:], k, v, layout="bhsd")), 2)
    assert torch.equal(o, want)
    ref = TORCH_SDPA(q.float(), k.float(), v.float(), is_causal=True)
    assert (o.float() - ref).norm() / ref.norm() < 0.1


def test_sdpa_other_ranks_and_patch():
    q, k, v = bhsd(b=1)
    with no_sync(), sdpa.patch():
        o3 = F.scaled_dot_product_attention(q[0], k[0], v[0])
        o5 = F.scaled_dot_product_attention(q[None], k[None], v[None])
        want = fp4attn.attn_func(q, k, v, layout="bhsd")
    assert torch.equal(o3, want[0]) and torch.equal(o5, want[None])
    assert sdpa.fallback_counts() == counted(calls=2)


@pytest.mark.parametrize(
    "reason, make, kwargs",
    [
        ("dtype", lambda: bhsd(dtype=torch.float32), {}),
        ("recipe", bhsd, {"recipe": "bf16"}),  # the golden model's only
        ("attn_mask", bhsd, {"attn_mask": "all True"}),
        ("head_dim", lambda: bhsd(d=96), {}),
    ],
)
def test_cuda_fallbacks(reason, make, kwargs):
    q, k, v = make()
    if "attn_mask" in kwargs:
        kwargs["attn_mask"] = torch.ones(256, 256, dtype=torch.bool, device="cuda")
    o = sdpa.scaled_dot_product_attention(q, k, v, **kwargs)
    kwargs.pop("recipe", None)
    assert torch.equal(o, TORCH_SDPA(q, k, v, **kwargs))
    assert sdpa.fallback_counts() == counted(**{reason: 1})


def test_sdpa_gradients_run_on_the_gpu():
    def grads(attend):
        q, k, v = (t.requires_grad_() for t in bhsd(h=4, h_kv=2))
        attend(q, k, v).float().square().sum().backward()
        return q.grad, k.grad, v.grad

    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # the GPU backward's fixed summation order
    try:
        got = grads(lambda q, k, v: sdpa.scaled_dot_product_attention(q, k, v, enable_gqa=True))
        want = grads(lambda q, k, v: fp4attn.attn_func(q, k, v, layout="bhsd"))
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert sdpa.fallback_counts() == counted(calls=1)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_sdpa_torch_compile_fullgraph():
    q, k, v = bhsd()

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa.patch():
        eager = attend(q, k, v)
        compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
        first = compiled(q, k, v)  # compiles
        with no_sync():
            out = compiled(q, k, v)
    assert torch.equal(first, eager) and torch.equal(out, eager)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("smooth_k", [True, False])
@pytest.mark.parametrize("is_causal", [False, True])
def test_sage_bit_for_bit(layout, smooth_k, is_causal):
    q, k, v = bhsd(h=4, h_kv=2, k_mean=2.0)
    args = (q, k, v) if layout == "HND" else tuple(t.transpose(1, 2) for t in (q, k, v))
    with no_sync():
        o, lse = sage.sageattn(
            *args, tensor_layout=layout, is_causal=is_causal, return_lse=True, smooth_k=smooth_k
        )
        want, want_lse = fp4attn.attn_func(
            q, k, v, causal=is_causal, return_lse=True, layout="bhsd", smooth_k=smooth_k
        )
    assert torch.equal(o, want if layout == "HND" else want.transpose(1, 2))
    assert torch.equal(lse, want_lse) and lse.shape == (2, 4, 256)


def test_sage_padding_and_top_left():
    q, k, v = bhsd(d=80, s_q=384, s_k=128)
    with no_sync():
        o, lse = sage.sageattn(q, k, v, is_causal=True, return_lse=True)
        pad = [F.pad(t, (0, 48)) for t in (q, k, v)]
        run = {
            "softmax_scale": 1 / math.sqrt(80), "return_lse": True, "layout": "bhsd",
            "smooth_k": True,
        }  # fmt: skip
        head, lse_head = fp4attn.attn_func(pad[0][:, :, :128], *pad[1:], causal=True, **run)
        tail, lse_tail = fp4attn.attn_func(pad[0][:, :, 128:], *pad[1:], **run)
    assert torch.equal(o, torch.cat((head, tail), 2)[..., :80])
    assert torch.equal(lse, torch.cat((lse_head, lse_tail), 2))
