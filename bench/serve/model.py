"""The model: a Llama decoder's configuration (Llama-3.1-8B, and the tiny one of --tiny), its
seeded random weights, RoPE with Llama 3.1's frequency scaling, and the one-token decode step
over a cache that a system's attend() appends to and attends."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import first_line

# Llama-3.1-8B; rope: Llama 3.1's frequency scaling (rope_type "llama3").
LLAMA31_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    rms_norm_eps=1e-5,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rope_scaling=dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
)
TINY = dict(
    LLAMA31_8B,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=1000,
)


def llama_config(spec, layers):
    """transformers.LlamaConfig of spec with `layers` layers (RoPE parameters in v5's
    rope_parameters, or v4's rope_theta / rope_scaling)."""
    import transformers
    from transformers import LlamaConfig

    common = {k: v for k, v in spec.items() if k not in ("rope_theta", "rope_scaling")}
    common.update(num_hidden_layers=layers, tie_word_embeddings=False, attention_bias=False,
                  mlp_bias=False, hidden_act="silu")  # fmt: skip
    scaling = spec["rope_scaling"]
    if int(transformers.__version__.split(".")[0]) >= 5:
        rope = dict(scaling or {"rope_type": "default"}, rope_theta=spec["rope_theta"])
        return LlamaConfig(**common, rope_parameters=rope)
    return LlamaConfig(**common, rope_theta=spec["rope_theta"], rope_scaling=scaling)


def rope_inv_freq(head_dim, theta, scaling):
    """RoPE's inverse frequencies, with Llama 3.1's scaling when given: wavelengths above
    original / low_freq_factor are divided by factor, those below original / high_freq_factor
    kept, the band between interpolated linearly in original / wavelength."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling or scaling.get("rope_type", "default") == "default":
        return inv
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    orig = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    smooth = (orig / wavelen - low) / (high - low)
    band = (wavelen <= orig / low) & (wavelen >= orig / high)
    return torch.where(band, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def rms_norm(x, w, eps):
    """Llama's RMSNorm: float32 statistics, the weight applied in the input dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def rope(x, cos, sin):
    """x [b, heads, d] rotated by its sequence's position (cos, sin [b, 1, d]; halves
    convention, as transformers' Llama)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Model:
    """Weights of a Llama decoder and a one-token decode step over them.

    The weights live in transformers' LlamaForCausalLM modules (self.hf), made on the device in
    bfloat16 and re-initialised here (seeded, so every run has the same model); without
    transformers, tensors of the same shapes are made directly (source says which)."""

    def __init__(self, spec, layers, device, seed, init_std, max_pos):
        self.spec, self.device, self.dtype = dict(spec), device, torch.bfloat16
        self.hidden = spec["hidden_size"]
        self.heads = spec["num_attention_heads"]
        self.kv_heads = spec["num_key_value_heads"]
        self.head_dim = spec["head_dim"]
        self.vocab = spec["vocab_size"]
        self.eps = spec["rms_norm_eps"]
        self.n_layers = layers
        self.hf, self.config, self.source = None, None, "own tensors"
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        try:
            self._from_transformers(layers)
        except Exception as e:  # no transformers, or an API it lacks: same shapes, own tensors
            self.source = f"own tensors (transformers failed: {first_line(e)})"
            self._own_tensors(layers)
        with torch.no_grad():
            for _, p in self._named():
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, init_std, generator=gen)
        self.params = sum(p.numel() for _, p in self._named())
        inv = rope_inv_freq(self.head_dim, spec["rope_theta"], spec["rope_scaling"])
        self.inv_freq = inv
        freqs = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)
        # The std of k and v (the same in every layer: RMSNorm feeds the projections), for the
        # random prompt KV and the NVFP4 globals.
        with torch.no_grad():
            ids = torch.randint(0, self.vocab, (256,), generator=gen, device=device)
            x = rms_norm(F.embedding(ids, self.embed), self.layers[0]["ln1"], self.eps)
            self.k_std = F.linear(x, self.layers[0]["wk"]).float().std().item()
            self.v_std = F.linear(x, self.layers[0]["wv"]).float().std().item()

    def _from_transformers(self, layers):
        import transformers
        from transformers import LlamaForCausalLM

        self.config = llama_config(self.spec, layers)
        old = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)
        try:
            with torch.device(self.device):
                hf = LlamaForCausalLM(self.config)
        finally:
            torch.set_default_dtype(old)
        hf.eval().requires_grad_(False)
        for prm in hf.parameters():  # not hf.to(): that would round RoPE's float32 inv_freq
            if prm.dtype != self.dtype:
                prm.data = prm.data.to(self.dtype)
        m = hf.model
        self.embed, self.norm = m.embed_tokens.weight, m.norm.weight
        self.lm_head = hf.lm_head.weight
        self.layers = [
            dict(wq=ly.self_attn.q_proj.weight, wk=ly.self_attn.k_proj.weight,
                 wv=ly.self_attn.v_proj.weight, wo=ly.self_attn.o_proj.weight,
                 wg=ly.mlp.gate_proj.weight, wu=ly.mlp.up_proj.weight,
                 wd=ly.mlp.down_proj.weight, ln1=ly.input_layernorm.weight,
                 ln2=ly.post_attention_layernorm.weight)
            for ly in m.layers
        ]  # fmt: skip
        self.hf = hf
        self.source = f"transformers {transformers.__version__} LlamaForCausalLM modules"

    def _own_tensors(self, layers):
        h, i, d = self.hidden, self.spec["intermediate_size"], self.head_dim
        q, kv = self.heads * d, self.kv_heads * d

        def t(*shape):
            return torch.empty(shape, dtype=self.dtype, device=self.device)

        self.embed, self.norm, self.lm_head = t(self.vocab, h), t(h), t(self.vocab, h)
        self.layers = [
            dict(wq=t(q, h), wk=t(kv, h), wv=t(kv, h), wo=t(h, q), wg=t(i, h), wu=t(i, h),
                 wd=t(h, i), ln1=t(h), ln2=t(h))
            for _ in range(layers)
        ]  # fmt: skip

    def _named(self):
        yield "embed", self.embed
        for n, ly in enumerate(self.layers):
            for k in sorted(ly):
                yield f"layers.{n}.{k}", ly[k]
        yield "norm", self.norm
        yield "lm_head", self.lm_head

    def describe(self):
        s = self.spec
        return {
            "architecture": "Llama-3.1-8B (transformers.LlamaConfig), first layers only",
            "hidden_size": s["hidden_size"],
            "intermediate_size": s["intermediate_size"],
            "num_attention_heads": s["num_attention_heads"],
            "num_key_value_heads": s["num_key_value_heads"],
            "head_dim": s["head_dim"],
            "vocab_size": s["vocab_size"],
            "rms_norm_eps": s["rms_norm_eps"],
            "rope_theta": s["rope_theta"],
            "rope_scaling": s["rope_scaling"],
            "layers": self.n_layers,
            "params": self.params,
            "dtype": "bfloat16",
            "weights": f"{self.source}; random normal(0, init_std), norms 1, seeded; no download",
            "k_std": self.k_std,
            "v_std": self.v_std,
            "forward": "own decode step (RMSNorm, RoPE per position, GQA attention over the "
            "cache, SwiGLU, lm_head, greedy argmax) over those weights",
        }

    def decode(self, ids, pos, attend, probes=None):
        """Logits [b, vocab] of one new token per sequence: ids, pos int64 [b]; attend(layer, q
        [b, heads, d], k, v [b, kv_heads, d]) appends k, v to the layer's cache and returns the
        attention output [b, heads * d]; probes [2, b, heads * d] receive the first and the last
        layer's attention output."""
        b, d = ids.shape[0], self.head_dim
        h = F.embedding(ids, self.embed)
        cos = self.cos[pos].to(h.dtype).unsqueeze(1)
        sin = self.sin[pos].to(h.dtype).unsqueeze(1)
        last = len(self.layers) - 1
        for i, w in enumerate(self.layers):
            x = rms_norm(h, w["ln1"], self.eps)
            q = rope(F.linear(x, w["wq"]).view(b, self.heads, d), cos, sin)
            k = rope(F.linear(x, w["wk"]).view(b, self.kv_heads, d), cos, sin)
            v = F.linear(x, w["wv"]).view(b, self.kv_heads, d)
            o = attend(i, q, k, v)
            if probes is not None and i == 0:
                probes[0].copy_(o)
            if probes is not None and i == last:
                probes[1].copy_(o)
            h = h + F.linear(o, w["wo"])
            x = rms_norm(h, w["ln2"], self.eps)
            h = h + F.linear(F.silu(F.linear(x, w["wg"])) * F.linear(x, w["wu"]), w["wd"])
        return F.linear(rms_norm(h, self.norm, self.eps), self.lm_head)
