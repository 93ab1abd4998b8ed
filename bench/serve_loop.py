#!/usr/bin/env python3
"""A decoder LLM generation loop with continuous batching, with its KV cache in fp4attn's NVFP4
paged cache, beside the same model with a BF16 paged cache and with SDPA on a contiguous BF16
cache (issue 22, item 3; the record bench/results/serve.json).

The model: a Llama-3.1-8B-architecture decoder from transformers.LlamaConfig (hidden 4096, MLP
14336, 32/8 heads, d = 128, vocab 128256, RoPE theta 500000 with Llama 3.1's frequency scaling),
--layers of its layers (default 8), random bfloat16 weights made on the device (transformers'
LlamaForCausalLM modules hold them, re-initialised here from a seeded normal(0, 0.02), norms 1).
The decode step is our own minimal forward over those weights: embedding, per layer RMSNorm,
q/k/v projections, RoPE at each sequence's own position, append + attention over the cache,
o_proj, RMSNorm, SwiGLU MLP; final RMSNorm, lm_head, greedy argmax. Every per-step tensor is
static, so the whole step (all layers, append, attention, MLP, lm_head, argmax) is captured in
ONE CUDA graph and replayed; before each replay the host scheduler writes the step's page
tables, lengths, slots, positions and new-sequence tokens into the static tensors (pinned
staging buffers, non_blocking copies, outside the graph).

Continuous batching: --batch slots; each holds a sequence whose cached prompt is drawn in
[0.75, 1] x context and which generates a number of tokens drawn from --gen-range; the first
sequences start part-way through their generation, so replacements are spread over the steps.
A finished sequence's pages go back to the free list (pages in random order) and a new
sequence takes its slot: its prompt's KV is random data (std of the model's own k/v) written
with one append per layer (fp4attn: one append_kv call), which is not timed: prefill compute is
not what this measures. Every decode step runs the real model.

Systems (same weights, same scheduler and seeds, page size 16):
* fp4attn-nvfp4: per layer PagedKVCache.empty(format="nvfp4") (globals supplied: 2688 / (8
  std)), append_kv(cache, k, v, int64 slots), then one DecodePlan (capacity = the slot's page
  capacity) whose run(q, cache, block_tables, seq_lens, out=...) serves all layers and steps.
* bf16-paged: BF16 pages [num_pages, 16, 8, 128] per layer for K and V (vLLM's NHD layout),
  written by index_copy_ of the new tokens' slots; attended by torch FlexAttention
  (torch.compile, the flex-decoding kernel) on the pool viewed as [1, 8, num_pages * 16, 128]
  with a BlockMask built from the page table (kv_indices = the sequence's page ids,
  kv_num_blocks = its page count: it reads only its own pages, each byte once) and a mask_mod
  that keeps a key iff its page belongs to the sequence and its logical position is below the
  length (so the last page's tail is masked, and the mask alone is right even where the block
  sparsity is not used, as in eager CPU flex). If FlexAttention fails, the pages are gathered
  into a contiguous copy per layer and attended by SDPA ("attention" says which ran).
* sdpa-contiguous: a contiguous BF16 cache [batch, 8, max_len, 128] per layer, the new token
  written at its position, attended by torch SDPA (cuDNN if it takes a boolean length mask, else
  the efficient backend; "sdpa_backend" says which) with q as [b, 8, 4, 128] (a GQA group's 4
  query heads as 4 query rows) and a boolean mask [b, 1, 1, max_len]; it reads max_len tokens
  of every sequence.

Measured per context (--contexts, default 4096,16384) and system: tokens/s = batch x timed
steps / (sum over the timed steps of the GPU time between CUDA events around the metadata
copies and the graph replay), after --warmup steps; the prompt fills of replaced sequences
happen before a step's first event. tokens_per_s_wall also counts the host scheduling and the
fills. Correctness guard: the first --guard-steps steps of every system run from the same state
with the same (teacher-forced) tokens; logits_cos_vs_sdpa is the smallest cosine of a step's
logits against sdpa-contiguous's (attn_cos_vs_sdpa: the attention outputs of the first and last
layer). sequences_at_budget: sequences of the context that each format's cache holds in
--kv-budget-gb (default: what the BF16 paged cache needs for batch x the largest context, all
layers), from the bytes per page (NVFP4: per kv head 64 data + 8 scale bytes for K and V each;
BF16: 256 each) and page rounding; the NVFP4 pool of that size is then allocated and decoded
over (the largest context) to verify it.

    python3 bench/serve_loop.py OUT.json [--contexts 4096,16384] [--layers 8] [--batch 32]
    python3 bench/serve_loop.py OUT.json --device cpu --tiny      # the logic on CPU, no graph

--device cpu --tiny: a small model (hidden 256, 4/2 heads, d = 64, 2 layers, vocab 1000),
batch 3, context 64, 3 steps, every system on CPU (fp4attn's golden path, eager FlexAttention),
plus a self-test of the decode forward against transformers' own forward of the same weights.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve.main import main  # the benchmark's parts: bench/serve/ (its __init__ lists them)

if __name__ == "__main__":
    sys.exit(main())
