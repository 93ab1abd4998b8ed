"""bench/serve_loop.py's generation-loop benchmark, one job a module:

* common: the page size, the log line, error forms, freeing memory between systems;
* model: the Llama configuration, seeded random weights, RoPE, the one-token decode step;
* scheduler: the cache geometry, sequence draws, slots and pages, the step's static metadata;
* systems: the three KV caches and their attention (fp4attn NVFP4, BF16 paged, SDPA contiguous);
* loop: one system's generation loop (fills, step, CUDA graph) and its timed run;
* checks: the guard comparison against sdpa-contiguous and the self-test against transformers;
* budget: bytes per page, sequences at a KV budget, the NVFP4 pool check;
* main: the arguments, every system at every context, the summary and the record.

main.py puts bench/ on sys.path for record.py and peers.py, as the bench scripts do.
"""
