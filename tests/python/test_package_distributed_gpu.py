"""fp4attn.distributed on GPUs over NCCL (skipped without a GPU and a CUDA build, or, for the group
tests, fewer than 2 GPUs): world size = torch.cuda.device_count() processes, one GPU each, against
the single-GPU kernel of the same recipe.

* Wire format, one GPU: packed FP4 K (and nvfp4-all's V) built and folded on the GPU equal the
  shard's operand bytes (quantize_shard on the GPU) and the CPU's packed bytes.
* Groups: ring (causal zig-zag, contiguous, odd lengths, GQA, packed and operand wire formats) and
  Ulysses against attn_func on the whole sequence on one GPU. The ring's partials are 16-bit
  engine outputs merged in float32, so it is compared within a tolerance (rel-L2 and max error),
  not bit for bit; Ulysses runs the same kernel on whole heads.
* A deadline kills the processes so a hang fails; NCCL's own timeout is 60 s; NVLink multicast is
  off in the spawned environment (NO_MULTICAST_ENV).
"""

from __future__ import annotations

import datetime
import os
import time
import traceback

import pytest
import torch
import torch.multiprocessing as mp

import fp4attn
from fp4attn import distributed as fd
from package_util import QUANTIZED_RECIPES, qkv, rel_l2

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and fp4attn._C.has_cuda()),
    reason="needs a CUDA GPU and an fp4attn build with CUDA",
)

DEADLINE_S = 120  # the whole spawn (gpu-check-cp gives pytest 150 s)
COLLECTIVE_TIMEOUT_S = 60
MAX_REL_L2 = 0.01  # ring vs one GPU: 16-bit partial outputs merged in float32
MAX_ABS_REL = 0.04  # max |o - ref| / max |ref|
MAX_LSE_ABS = 5e-3


def gpu_world() -> int:
    return torch.cuda.device_count()


def case(strategy, s, recipe, causal=False, zigzag=False, h=8, h_kv=2, d=128, seed=0):
    return dict(strategy=strategy, s=s, recipe=recipe, causal=causal, zigzag=zigzag, h=h,
                h_kv=h_kv, d=d, seed=seed)


CASES = {
    "ring-causal-zigzag-nvfp4": case("ring", 4099, "nvfp4", causal=True, zigzag=True),
    "ring-nvfp4-all": case("ring", 3001, "nvfp4-all"),
    "ring-causal-zigzag-nvfp4-all": case("ring", 4096, "nvfp4-all", causal=True, zigzag=True),
    "ring-causal-contiguous-mxfp4": case("ring", 2500, "mxfp4", causal=True),
    "ring-fp8-d64": case("ring", 1999, "fp8", d=64, h=4, h_kv=4),
    "ring-zigzag-fp4-direct-mqa": case("ring", 2049, "fp4-direct", zigzag=True, h_kv=1),
    "ring-nvfp4-hx": case("ring", 777, "nvfp4-hx", h_kv=8),
    "ulysses-causal-nvfp4": case("ulysses", 3001, "nvfp4", causal=True),
}


def inputs(c):
    return qkv(s_q=c["s"], h=c["h"], h_kv=c["h_kv"], d=c["d"], dtype=torch.bfloat16,
               seed=c["seed"])


# ---- one GPU: the wire format --------------------------------------------------------------


PACKED_RECIPES = [r for r in QUANTIZED_RECIPES if fd.wire_formats(r)["k"] != "operand"]


@pytest.mark.parametrize("recipe", PACKED_RECIPES)
def test_gpu_packed_messages_fold_to_the_shard_operands(recipe):
    """What the ring sends for a shard, unpacked on the GPU, equals quantize_shard on the GPU
    (and the packed bytes equal the CPU's), for every shard of a zig-zag split, an empty one
    included."""
    s, world = 3001, 4
    q, k, v = qkv(s_q=s, h=4, h_kv=2, d=128, dtype=torch.bfloat16, seed=5)
    k[0, 17, 1, 9] = 40.0
    v[0, 2900, 0, 3] = -30.0
    fmt = fd.wire_formats(recipe)
    amax = {}
    for name, x in (("k", k), ("v", v)):
        amax[name] = {d: x.abs().amax(1).float().to(d) for d in ("cuda", "cpu")}
    for ranges in fd.shard_ranges(s, world, zigzag=True) + [[(0, 0)]]:
        idx = torch.cat([torch.arange(a, e) for a, e in ranges])
        kl, vl = k.index_select(1, idx), v.index_select(1, idx)
        n = kl.shape[1]
        msgs = {}
        for d in ("cuda", "cpu"):
            kd, ks, k_ext = fd._quantize_shard(kl.to(d), amax["k"][d], recipe, "k")
            vd, vs = fd.quantize_shard(vl.to(d), amax["v"][d], recipe, "v")
            parts = list(fd._pack_k(kl.to(d), amax["k"][d], recipe, fmt["k"]))
            parts += [vd] if fmt["v"] == "operand" else list(fd._pack_v(vl.to(d), amax["v"][d]))
            msgs[d] = fd._to_message(parts)
            got = fd._unpack_message(msgs[d], recipe, 1, 2, n, 128, k_ext[:, :, :1])
            for want, have, what in zip((kd, ks, vd), got, ("k_data", "k_scale", "v_data")):
                assert want.shape == have.shape, (recipe, d, what, n)
                a = want.view(torch.uint8) if want.element_size() == 1 else want
                b = have.view(torch.uint8) if have.element_size() == 1 else have
                assert torch.equal(a, b), (recipe, d, what, n)
        assert torch.equal(msgs["cuda"].cpu(), msgs["cpu"]), (recipe, n)


# ---- groups of GPUs ---------------------------------------------------------------------------


def _run(c):
    q, k, v = (t.cuda() for t in inputs(c))
    local = [fd.shard(t, zigzag=c["zigzag"]) for t in (q, k, v)]
    fn = fd.ring_attn_func if c["strategy"] == "ring" else fd.ulysses_attn_func
    stats = {}
    o, lse = fn(*local, causal=c["causal"], recipe=c["recipe"], return_lse=True,
                zigzag=c["zigzag"], stats=stats)
    o = fd.unshard(o, zigzag=c["zigzag"])
    lse = fd.unshard(lse, zigzag=c["zigzag"], seq_dim=2)
    ref, ref_lse = fp4attn.attn_func(q, k, v, causal=c["causal"], recipe=c["recipe"],
                                     return_lse=True)
    torch.cuda.synchronize()
    err = (o.float() - ref.float()).abs()
    finite = torch.isfinite(ref_lse)
    return {
        "rel_l2": rel_l2(o, ref),
        "max_abs_rel": float(err.max() / ref.float().abs().max()),
        "lse_abs": float((lse - ref_lse)[finite].abs().max()) if finite.any() else 0.0,
        "exact": bool(torch.equal(o, ref)),
        "nan": bool(torch.isnan(o).any() or torch.isnan(lse).any()),
        "stats": stats,
        "local_len": local[0].shape[1],
    }


def _worker(rank, world, store, outdir):
    os.environ.update(fd.NO_MULTICAST_ENV)
    torch.cuda.set_device(rank)
    import torch.distributed as dist

    fd.init_process_group(
        "nccl", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
        device_id=torch.device("cuda", rank),
    )
    results = {"env": {k: os.environ.get(k) for k in fd.NO_MULTICAST_ENV}}
    for name, c in CASES.items():
        try:
            results[name] = _run(c)
        except Exception:  # noqa: BLE001 - reported by the parent
            results[name] = traceback.format_exc()
            break  # a failed collective may leave the group unusable
    dist.barrier()
    dist.destroy_process_group()
    torch.save(results, os.path.join(outdir, f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    world = gpu_world()
    if world < 2:
        pytest.skip(f"needs 2 or more GPUs (found {world})")
    tmp = tmp_path_factory.mktemp("nccl")
    os.environ.update(fd.NO_MULTICAST_ENV)  # the spawned processes inherit it
    ctx = mp.spawn(_worker, args=(world, str(tmp / "store"), str(tmp)), nprocs=world, join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{world} GPUs: no result after {DEADLINE_S} s (a hang?)")
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.mark.parametrize("name", list(CASES))
def test_nccl_result_matches_one_gpu(ranks, name):
    got = ranks[0].get(name)
    assert got is not None, "not run (an earlier case failed)"
    assert not isinstance(got, str), got
    c = CASES[name]
    print(f"{len(ranks)} GPUs {name}: rel_l2 {got['rel_l2']:.2e}, max {got['max_abs_rel']:.2e} "
          f"of max |ref|, lse {got['lse_abs']:.2e}, bit-exact {got['exact']}, stats "
          f"{got['stats']}")
    assert not got["nan"]
    assert got["rel_l2"] <= MAX_REL_L2 and got["max_abs_rel"] <= MAX_ABS_REL, got
    assert got["lse_abs"] <= MAX_LSE_ABS, got
    if c["strategy"] == "ring":
        world = len(ranks)
        lens = [r[name]["local_len"] for r in ranks]
        for r in range(world):
            st = ranks[r][name]["stats"]
            held = [lens[(r - i) % world] for i in range(world - 1)]
            want = sum(
                fd.message_bytes(c["recipe"], 1, c["h_kv"], n, c["d"])["total"] for n in held
            )
            assert st["messages"] == world - 1 and st["bytes_sent"] == want, (r, st)


def test_nccl_multicast_is_off(ranks):
    assert all(r["env"] == fd.NO_MULTICAST_ENV for r in ranks)
