"""fp4attn._C takes any DLPack producer and does not need torch: numpy arrays through the
extension give the same bytes as the torch API."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fp4attn
from package_util import qkv

EXT = Path(fp4attn._C.__file__)
LOAD_STANDALONE = f"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("_C", {str(EXT)!r})
ext = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ext)
"""


def test_extension_loads_without_torch():
    code = LOAD_STANDALONE + "print(len(ext.recipes()), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(fp4attn.RECIPES)), "False"]


@pytest.fixture(scope="module")
def ext():
    spec = importlib.util.spec_from_file_location("_C", EXT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_numpy_golden_forward_matches_torch(ext):
    q, k, v = qkv(s_q=64, s_k=96, h=4, h_kv=2, d=64)
    o = np.empty(q.shape, np.float32)
    lse = np.empty((1, 4, 64), np.float32)
    ext.golden_forward(q.numpy(), k.numpy(), v.numpy(), o, lse, "nvfp4", 0.0, True)
    ref, ref_lse = fp4attn.attn_func(q, k, v, causal=True, recipe="nvfp4", return_lse=True)
    assert np.array_equal(o, ref.numpy()) and np.array_equal(lse, ref_lse.numpy())


def test_numpy_operands_match_torch(ext):
    q, k, v = qkv(s_q=40, d=128)
    data = np.empty((1, 4, 128, 48), np.uint8)  # V^T: tokens padded to 48
    scale = np.empty((1, 4, 128), np.float32)
    ext.quantize_operand_host(v.numpy(), "fp8", "v", 0.0, False, data, scale, None)
    ops = fp4attn.quantize_qkv(q, k, v, recipe="fp8")
    assert np.array_equal(data, ops.v_data.view(torch.uint8).numpy())
    assert np.array_equal(scale, ops.v_scale.numpy())


def test_strided_numpy_views(ext):
    q, k, v = qkv(s_q=32, d=64)
    qt = np.ascontiguousarray(q.numpy().transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # BHSD mem
    o = np.empty(q.shape, np.float32)
    ext.golden_forward(qt, k.numpy(), v.numpy(), o, None, "fp8", 0.0, False)
    assert np.array_equal(o, fp4attn.attn_func(q, k, v, recipe="fp8").numpy())


def test_extension_errors(ext):
    x = np.zeros((1, 16, 4, 64), np.float32)
    o = np.zeros_like(x)
    with pytest.raises(ValueError, match="^recipe: unknown recipe 'nope'"):
        ext.golden_forward(x, x, x, o, None, "nope", 0.0, False)
    # int16, not complex64: a complex array crashed inside the DLPack import on the device's
    # numpy 2.5.2 (before our dtype check runs); every unlisted dtype takes the same path here.
    with pytest.raises(TypeError, match="^k: unsupported dtype"):
        ext.golden_forward(x, x.astype(np.int16), x, o, None, "fp8", 0.0, False)
    with pytest.raises(ValueError, match="^o: expected shape"):
        ext.golden_forward(x, x, x, o[:, :8], None, "fp8", 0.0, False)
