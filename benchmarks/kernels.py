"""Check and time every Triton kernel on the GPU against its PyTorch reference, a peer
(``F.scaled_dot_product_attention``'s fastest backend for attention, the plain torch ops for the
rest) and the ceilings measured in the same run (device-to-device copy bandwidth, counting bytes
read + written; bf16 matmul rate). Times are ``triton.testing.do_bench`` medians.

    python -m benchmarks.kernels [--sweep] [--json results.json]

``--small`` runs tiny shapes on the CPU under ``TRITON_INTERPRET=1`` (a smoke test of the script).

``--sweep`` also times a few tile configurations of the attention kernels (for tuning).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_kernels import reference  # noqa: E402
from engine_kernels import triton_ops as tops  # noqa: E402
from engine_kernels.decode_split import (  # noqa: E402
    DecodePlan,
    default_plan_programs,
    plan_workspace_numel,
)

SMALL = "--small" in sys.argv
DEV = torch.device("cpu" if SMALL else "cuda")
BF16 = torch.float32 if SMALL else torch.bfloat16


def size(full: int, small: int) -> int:
    return small if SMALL else full


@dataclass
class Row:
    kernel: str
    shape: str
    ms: float
    unit: str  # "GB/s" or "TFLOP/s"
    rate: float
    pct_ceiling: float
    rel_err: float
    ref_ms: float | None = None
    peer: str = ""
    peer_ms: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def vs_peer(self) -> float | None:
        return None if self.peer_ms is None else self.peer_ms / self.ms


def bench(fn: Callable[[], object], rep: int = 200) -> float:
    if SMALL:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    if out.isnan().any():
        return float("nan")
    return ((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()


def log(msg: str) -> None:
    print(msg, flush=True)


# ---------------------------------------------------------------- ceilings


def copy_bandwidth() -> float:
    src = torch.randn(size(1 << 30, 1 << 16), dtype=BF16, device=DEV)  # 2 GiB
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / ms / 1e6  # GB/s


def matmul_rate() -> float:
    n = size(8192, 128)
    a = torch.randn(n, n, dtype=BF16, device=DEV)
    b = torch.randn(n, n, dtype=BF16, device=DEV)
    ms = bench(lambda: a @ b)
    return 2 * n**3 / ms / 1e9  # TFLOP/s


# ---------------------------------------------------------------- memory-bound kernels


def bw_row(name, shape, ms, nbytes, bw, err, ref_ms, peer="", peer_ms=None) -> Row:
    rate = nbytes / ms / 1e6
    return Row(name, shape, ms, "GB/s", rate, 100 * rate / bw, err, ref_ms, peer, peer_ms)


def bench_rms_norm(bw: float) -> list[Row]:
    rows, hidden = size(32768, 8), size(4096, 256)
    x = torch.randn(rows, hidden, dtype=BF16, device=DEV)
    res = torch.randn_like(x)
    w = torch.randn(hidden, dtype=BF16, device=DEV)
    shape = f"{rows}x{hidden} bf16"
    nbytes = 2 * x.numel() * 2
    err = rel_err(tops.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6))
    out = [
        bw_row("rms_norm", shape, bench(lambda: tops.rms_norm(x, w, 1e-6)), nbytes, bw, err,
               bench(lambda: reference.rms_norm(x, w, 1e-6)), "F.rms_norm",
               bench(lambda: F.rms_norm(x, (hidden,), w, 1e-6)))
    ]  # fmt: skip
    got, s = tops.fused_add_rms_norm(x, res, w, 1e-6)
    ref, rs = reference.fused_add_rms_norm(x, res, w, 1e-6)
    err = max(rel_err(got, ref), rel_err(s, rs))
    out.append(
        bw_row("fused_add_rms_norm", shape, bench(lambda: tops.fused_add_rms_norm(x, res, w, 1e-6)),
               2 * nbytes, bw, err, bench(lambda: reference.fused_add_rms_norm(x, res, w, 1e-6)),
               "add + F.rms_norm", bench(lambda: F.rms_norm(x + res, (hidden,), w, 1e-6)))
    )  # fmt: skip
    return out


def bench_silu_and_mul(bw: float) -> list[Row]:
    rows, d = size(16384, 4), size(14336, 300)
    x = torch.randn(rows, 2 * d, dtype=BF16, device=DEV)
    err = rel_err(tops.silu_and_mul(x), reference.silu_and_mul(x))
    a, b = x[:, :d], x[:, d:]
    return [
        bw_row("silu_and_mul", f"{rows}x{2 * d} bf16", bench(lambda: tops.silu_and_mul(x)),
               3 * rows * d * 2, bw, err, bench(lambda: reference.silu_and_mul(x)),
               "F.silu(a) * b", bench(lambda: F.silu(a) * b))
    ]  # fmt: skip


def bench_rotary(bw: float) -> list[Row]:
    tokens, heads, kv_heads, dim = size(65536, 5), 32, 8, 128
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=BF16, device=DEV)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=DEV, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(32768, device=DEV, dtype=torch.float32), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), -1)
    pos = torch.randint(0, 32768, (tokens,), device=DEV)
    q1, k1, q2, k2 = q.clone(), k.clone(), q.clone(), k.clone()
    tops.rotary_embedding(pos, q1, k1, cache)
    reference.rotary_embedding(pos, q2, k2, cache)
    err = max(rel_err(q1, q2), rel_err(k1, k2))
    nbytes = 2 * tokens * (heads + kv_heads) * dim * 2 + tokens * dim * 4
    return [
        bw_row("rotary_embedding", f"{tokens} tok, {heads}/{kv_heads}x{dim} bf16 (qkv views)",
               bench(lambda: tops.rotary_embedding(pos, q, k, cache)), nbytes, bw, err,
               bench(lambda: reference.rotary_embedding(pos, q, k, cache)))
    ]  # fmt: skip


def bench_store_kvcache(bw: float) -> list[Row]:
    tokens, kv_heads, dim, page = size(65536, 7), 8, 128, 16
    num_blocks = 2 * triton.cdiv(tokens, page)
    key = torch.randn(tokens, kv_heads, dim, dtype=BF16, device=DEV)
    value = torch.randn_like(key)
    kc = torch.randn(num_blocks, page, kv_heads, dim, dtype=BF16, device=DEV)
    vc = torch.randn_like(kc)
    slots = torch.randperm(num_blocks * page, device=DEV)[:tokens].to(torch.int32)
    slots[::97] = -1
    kc2, vc2 = kc.clone(), vc.clone()
    tops.store_kvcache(key, value, kc, vc, slots)
    reference.store_kvcache(key, value, kc2, vc2, slots)
    err = max(rel_err(kc, kc2), rel_err(vc, vc2))
    return [
        bw_row("store_kvcache", f"{tokens} tok, {kv_heads}x{dim} bf16, scattered slots",
               bench(lambda: tops.store_kvcache(key, value, kc, vc, slots)),
               4 * key.numel() * 2, bw, err,
               bench(lambda: reference.store_kvcache(key, value, kc2, vc2, slots)))
    ]  # fmt: skip


def bench_qk_norm_rope_store(bw: float) -> list[Row]:
    """Qwen3's attention input side: per-head q/k RMSNorm, rotary, K/V to scattered slots; the
    peer is the same done by the separate Triton kernels (what the model ran before)."""
    tokens, heads, kv_heads, dim, page = size(65536, 7), 16, 8, 128, 16
    num_blocks = 2 * triton.cdiv(tokens, page)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, dtype=BF16, device=DEV)
    wq = torch.rand(dim, dtype=BF16, device=DEV) + 0.5
    wk = torch.rand(dim, dtype=BF16, device=DEV) + 0.5
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=DEV, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(32768, device=DEV, dtype=torch.float32), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), -1)
    pos = torch.randint(0, 32768, (tokens,), device=DEV)
    kc = torch.zeros(num_blocks, page, kv_heads, dim, dtype=BF16, device=DEV)
    vc = torch.zeros_like(kc)
    slots = torch.randperm(num_blocks * page, device=DEV)[:tokens]
    args = (pos, cache, kc, vc, slots, heads, kv_heads, wq, wk, 1e-6)
    kc2, vc2 = kc.clone(), vc.clone()
    q = tops.qk_norm_rope_store(qkv, *args)
    q2 = reference.qk_norm_rope_store(qkv.clone(), pos, cache, kc2, vc2, *args[4:])
    err = max(rel_err(q, q2), rel_err(kc, kc2), rel_err(vc, vc2))

    def unfused():
        qs, ks, vs = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        qn = tops.rms_norm(qs.reshape(tokens, heads, dim), wq, 1e-6)
        kn = tops.rms_norm(ks.reshape(tokens, kv_heads, dim), wk, 1e-6)
        tops.rotary_embedding(pos, qn, kn, cache)
        tops.store_kvcache(kn, vs.reshape(tokens, kv_heads, dim), kc, vc, slots)

    # qkv read once; q, k and v written once; cos/sin (fp32) read per token.
    nbytes = 2 * tokens * (heads + 2 * kv_heads) * dim * 2 + tokens * dim * 4
    return [
        bw_row("qk_norm_rope_store", f"{tokens} tok, {heads}/{kv_heads}x{dim} bf16, q/k norm",
               bench(lambda: tops.qk_norm_rope_store(qkv, *args)), nbytes, bw, err,
               bench(lambda: reference.qk_norm_rope_store(qkv.clone(), *args)),
               "the unfused Triton kernels", bench(unfused))
    ]  # fmt: skip


# ---------------------------------------------------------------- attention


def paged_copy(k: torch.Tensor, v: torch.Tensor, page: int):
    """Contiguous ``k/v [B, KVH, L, D]`` into a paged cache with scattered pages."""
    batch, kv_heads, length, dim = k.shape
    nb = length // page
    perm = torch.randperm(batch * nb, device=DEV).to(torch.int32)
    tables = perm.view(batch, nb)
    kc = torch.empty(batch * nb, page, kv_heads, dim, dtype=k.dtype, device=DEV)
    vc = torch.empty_like(kc)
    kc[tables.long()] = k.permute(0, 2, 1, 3).reshape(batch, nb, page, kv_heads, dim)
    vc[tables.long()] = v.permute(0, 2, 1, 3).reshape(batch, nb, page, kv_heads, dim)
    return kc, vc, tables


def fastest_sdpa(fn: Callable[[], object]) -> tuple[str, float, dict[str, float]]:
    times: dict[str, float] = {}
    backends = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]  # fmt: skip
    for name, backend in backends:
        try:
            with sdpa_kernel([backend]):
                fn()
                times[name] = bench(fn)
        except RuntimeError as e:  # backend refuses the shape
            log(f"  sdpa {name}: {str(e).splitlines()[0][:100]}")
    best = min(times, key=times.get)
    return f"SDPA {best}", times[best], times


PREFILL_DIMS = (128, 64)  # the issue's goal is on d128; d64 is the fixtures' head dim


def _prefill_inputs(dim: int):
    batch, heads, length, page = size(8, 2), size(16, 2), size(4096, 48), 16
    q4 = torch.randn(batch, heads, length, dim, dtype=BF16, device=DEV)
    k4, v4 = torch.randn_like(q4), torch.randn_like(q4)
    kc, vc, tables = paged_copy(k4, v4, page)
    q, k_new, v_new = (t.transpose(1, 2).reshape(batch * length, heads, dim) for t in (q4, k4, v4))
    lens = torch.full((batch,), length, dtype=torch.int32, device=DEV)
    qsl = torch.arange(0, batch + 1, device=DEV, dtype=torch.int32) * length
    return (batch, heads, length, page), (q4, k4, v4), (q, kc, vc, tables, lens, qsl, k_new, v_new)


def _prefill_sweep_configs(dim: int) -> list[tuple[str, dict]]:
    """(kernel, configuration): the paged kernel's candidates ("paged": every K/V through the
    block tables) and, where it is opted in, the TMA kernel's ("tma": the new tokens' K/V
    contiguous; without the opt-in they would time the paged kernel under the TMA's name)."""
    from engine_kernels import paged_attention_prefill as paged
    from engine_kernels import paged_attention_prefill_tma as tma
    from engine_kernels.ops import tma_prefill_enabled

    if SMALL:
        cfg = paged.default_config(torch.empty(0))
        return [("paged", cfg), ("paged", {**cfg, "loop": 1})]
    d = 64 if dim <= 64 else 128
    tma_configs = tma.CANDIDATE_CONFIGS[d] if tma_prefill_enabled() else []
    return [("paged", c) for c in paged.CANDIDATE_CONFIGS[d]] + [("tma", c) for c in tma_configs]


def _run_prefill(inputs, length: int, scale: float, kind: str, cfg: dict | None = None, out=None):
    """One prefill of the benchmark's batch: "tma" the engine's path on Hopper (the new K/V
    given contiguous), "paged" the block-table kernel alone."""
    q, kc, vc, tables, lens, qsl, k_new, v_new = inputs
    tma = kind == "tma"
    return tops.paged_attention_prefill(
        q, kc, vc, tables, lens, qsl, scale, max_query_len=length, out=out,
        k_new=k_new if tma else None, v_new=v_new if tma else None,
        config=None if tma else cfg, tma_config=cfg if tma else None,
        max_prefix_len=0,  # no cached prefix in this batch, and the engine says so too
    )  # fmt: skip


def _precompile_one(dim: int, kind: str, cfg: dict) -> str:
    """In a worker process: compile one configuration (same shapes, so the same specialisation
    and on-disk cache entry as the parent's run)."""
    try:
        (_, _, length, _), _, inputs = _prefill_inputs(dim)
        _run_prefill(inputs, length, dim**-0.5, kind, cfg)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:  # reported by the parent's own run
        return f"{type(e).__name__}: {str(e)[:80]}"


def precompile_prefill(workers: int = 8) -> None:
    """Compile the sweep's configurations in parallel processes: Triton's compiler runs on one
    core, and a dozen tile configurations compiled in turn cost minutes of device time."""
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = [(dim, kind, cfg) for dim in PREFILL_DIMS for kind, cfg in _prefill_sweep_configs(dim)]
    start = time.perf_counter()
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(min(workers, len(jobs)), mp_context=ctx) as pool:
        results = list(pool.map(_precompile_one, *zip(*jobs)))
    bad = [f"d{d} {k} {c}: {r}" for (d, k, c), r in zip(jobs, results) if r != "ok"]
    log(f"  precompiled {len(jobs)} prefill configs in {time.perf_counter() - start:.0f} s; "
        f"failed: {bad}")  # fmt: skip


def bench_prefill(rate_ceiling: float, sweep: bool) -> list[Row]:
    if sweep and not SMALL:
        precompile_prefill()
    return [row for dim in PREFILL_DIMS for row in _bench_prefill_case(rate_ceiling, sweep, dim)]


def _bench_prefill_case(rate_ceiling: float, sweep: bool, dim: int) -> list[Row]:
    """Two rows: the engine's prefill (the TMA kernel where it runs and is opted in, given the
    new K/V contiguous as the engine gives them) and the paged kernel alone (every K/V through
    the block tables, what a later chunk of a chunked prefill reads)."""
    (batch, heads, length, page), (q4, k4, v4), inputs = _prefill_inputs(dim)
    q, kc, vc, tables, lens, qsl, _, _ = inputs
    scale = dim**-0.5
    flops = 4 * batch * heads * dim * length * (length + 1) / 2

    sdpa = lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)
    peer, peer_ms, peers = fastest_sdpa(sdpa)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION] if not SMALL else [SDPBackend.MATH]):
        truth = sdpa().transpose(1, 2).reshape(batch * length, heads, dim)
    extra: dict = {"sdpa_ms": peers}
    if sweep:
        extra["sweep"] = []
        for kind, cfg in _prefill_sweep_configs(dim):
            try:
                out = torch.full_like(q, float("nan"))
                err = rel_err(_run_prefill(inputs, length, scale, kind, cfg, out), truth)
                ms = bench(lambda k=kind, c=cfg: _run_prefill(inputs, length, scale, k, c))
            except Exception as e:  # out of shared memory, ...
                log(f"  prefill d{dim} {kind} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                continue
            log(f"  prefill d{dim} {kind} {cfg}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s "
                f"x{peer_ms / ms:.2f} {peer} err {err:.1e}")  # fmt: skip
            extra["sweep"].append({"kernel": kind, **cfg, "ms": ms, "err": err})
    ref_ms = bench(
        lambda: reference.paged_attention_prefill(q, kc, vc, tables, lens, qsl, scale), rep=50
    )
    shape = f"causal, {batch}x{length} tok, {heads} heads, d{dim}, page {page}"
    rows = []
    for name, kind in (("paged_attention_prefill", "tma"), ("prefill (paged only)", "paged")):
        out = torch.full_like(q, float("nan"))
        err = rel_err(_run_prefill(inputs, length, scale, kind, None, out), truth)
        ms = bench(lambda kind=kind: _run_prefill(inputs, length, scale, kind))
        rate = flops / ms / 1e9
        rows.append(Row(name, shape, ms, "TFLOP/s", rate, 100 * rate / rate_ceiling, err, ref_ms,
                        peer, peer_ms, extra if kind == "tma" else {}))  # fmt: skip
    return rows


def bench_decode(bw: float, sweep: bool) -> list[Row]:
    rows = []
    cases = [(2, 64)] if SMALL else [(64, 4096), (16, 16384), (256, 1024)]
    for batch, length in cases:
        rows += _bench_decode_case(bw, batch, length, sweep and batch in (2, 64, 16))
    return rows


def _bench_decode_case(bw: float, batch: int, length: int, sweep: bool) -> list[Row]:
    """Two rows: the split decode (one grid per sequence x KV head x split) and the planned
    decode, the engine's default on CUDA (the total context cut into equal chunks)."""
    heads, kv_heads, dim, page = 32, 8, 128, 16
    group = heads // kv_heads
    k4 = torch.randn(batch, kv_heads, length, dim, dtype=BF16, device=DEV)
    v4 = torch.randn_like(k4)
    kc, vc, tables = paged_copy(k4, v4, page)
    q = torch.randn(batch, heads, dim, dtype=BF16, device=DEV)
    lens = torch.full((batch,), length, dtype=torch.int32, device=DEV)
    scale = dim**-0.5
    nbytes = 2 * k4.numel() * 2 + 2 * q.numel() * 2

    def ours(splits=None, cfg=None):
        return tops.paged_attention_decode(
            q, kc, vc, tables, lens, scale, num_splits=splits, config=cfg
        )

    # The peer sees the query heads of one KV head as `group` query rows: same bytes, no GQA.
    qg = q.view(batch, kv_heads, group, dim)
    sdpa = lambda: F.scaled_dot_product_attention(qg, k4, v4, scale=scale)
    peer, peer_ms, peers = fastest_sdpa(sdpa)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        truth = sdpa().reshape(batch, heads, dim)
    extra: dict = {"sdpa_ms": peers}
    if sweep:
        extra["sweep"] = []
        grid = [(64, 4, 3), (64, 4, 4), (128, 4, 3), (64, 8, 4)] if length <= 4096 else [(64, 4, 3)]
        for splits in [1, 2, 4, 8, 16]:
            for bn, w, s in grid:
                cfg = {"block_n": bn, "num_warps": w, "num_stages": s}
                try:
                    err = rel_err(ours(splits, cfg), truth)
                    ms = bench(lambda splits=splits, cfg=cfg: ours(splits, cfg))
                except Exception as e:
                    log(f"  decode splits={splits} {cfg}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                log(f"  decode splits={splits} {cfg}: {ms:.3f} ms "
                    f"{nbytes / ms / 1e6:.0f} GB/s err {err:.1e}")  # fmt: skip
                extra["sweep"].append({"splits": splits, **cfg, "ms": ms, "err": err})
    splits = tops.default_num_splits(batch, kv_heads, tables.shape[1] * page, DEV)
    extra["default_splits"] = splits
    ref_out = reference.paged_attention_decode(q, kc, vc, tables, lens, scale)

    def worst_err(fn: Callable[[], torch.Tensor]) -> float:
        return max(rel_err(fn(), truth), rel_err(fn(), ref_out))

    err = worst_err(ours)
    ref_ms = bench(lambda: reference.paged_attention_decode(q, kc, vc, tables, lens, scale), 50)
    ms = bench(ours)
    shape = f"{batch} seq x {length} ctx, {heads}/{kv_heads} heads, d{dim}, page {page}"
    row = bw_row("paged_attention_decode", shape, ms, nbytes, bw, err, ref_ms, peer, peer_ms)
    row.extra = extra

    plan = DecodePlan(batch, default_plan_programs(kv_heads, DEV), DEV)
    plan.fill([length] * batch)
    plan.device.copy_(plan.host)
    workspace = torch.empty(plan_workspace_numel(plan.max_items, heads, dim), device=DEV)

    def planned():
        return tops.paged_attention_decode(
            q, kc, vc, tables, lens, scale, plan=plan, workspace=workspace
        )

    ms = bench(planned)
    planned_row = bw_row(
        "decode (planned)", shape, ms, nbytes, bw, worst_err(planned), ref_ms, peer, peer_ms
    )
    planned_row.extra = {"num_programs": plan.num_programs}
    return [row, planned_row]


# ---------------------------------------------------------------- report


def table(rows: list[Row], bw: float, tflops: float) -> str:
    head = (f"ceilings: copy {bw:.0f} GB/s (read + write), bf16 matmul {tflops:.0f} TFLOP/s\n"
            f"{'kernel':<24} {'shape':<52} {'ms':>8} {'rate':>14} {'%ceil':>6} {'err':>8} "
            f"{'ref ms':>8} {'x ref':>6} {'peer':<18} {'peer ms':>8} {'x peer':>6}")  # fmt: skip
    lines = [head]
    for r in rows:
        ref = f"{r.ref_ms:8.3f} {r.ref_ms / r.ms:6.1f}" if r.ref_ms else f"{'':8} {'':6}"
        peer = f"{r.peer:<18} {r.peer_ms:8.3f} {r.vs_peer:6.2f}" if r.peer_ms else ""
        lines.append(
            f"{r.kernel:<24} {r.shape[:52]:<52} {r.ms:8.3f} {r.rate:8.0f} {r.unit:<5} "
            f"{r.pct_ceiling:5.0f}% {r.rel_err:8.1e} {ref} {peer}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="also time tile configurations")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--small", action="store_true", help="CPU smoke test, tiny shapes")
    parser.add_argument("--only", default="", help="comma-separated subset (e.g. decode,prefill)")
    args = parser.parse_args()
    name = "cpu (interpreter)" if SMALL else torch.cuda.get_device_name()
    log(f"{name} torch {torch.__version__} triton {triton.__version__}")
    torch.manual_seed(0)
    bw = copy_bandwidth()
    log(f"copy bandwidth {bw:.0f} GB/s")
    tflops = matmul_rate()
    log(f"bf16 matmul {tflops:.0f} TFLOP/s")
    sections = {
        "rms_norm": lambda: bench_rms_norm(bw),
        "silu": lambda: bench_silu_and_mul(bw),
        "rotary": lambda: bench_rotary(bw),
        "kv_store": lambda: bench_store_kvcache(bw),
        "qk_norm_rope_store": lambda: bench_qk_norm_rope_store(bw),
        "decode": lambda: bench_decode(bw, args.sweep),
        "prefill": lambda: bench_prefill(tflops, args.sweep),
    }
    only = set(filter(None, args.only.split(",")))
    rows: list[Row] = []
    for name, run in sections.items():
        if only and name not in only:
            continue
        log(f"== {name}")
        try:
            new = run()
        except Exception as e:  # keep the other sections' results
            log(f"  {name} FAILED: {type(e).__name__}: {e}")
            continue
        for r in new:
            log(f"  {r.kernel}: {r.ms:.3f} ms, {r.rate:.0f} {r.unit}, err {r.rel_err:.1e}")
        rows += new
        if not SMALL:
            torch.cuda.empty_cache()
    if args.json:
        payload = {"copy_gbps": bw, "matmul_tflops": tflops, "rows": [asdict(r) for r in rows]}
        args.json.write_text(json.dumps(payload, indent=1))
    log("")
    log(table(rows, bw, tflops))
    bad = [r.kernel for r in rows if not math.isfinite(r.rel_err) or r.rel_err > 2e-2]
    if bad:
        log(f"ACCURACY FAILURES: {bad}")
        sys.exit(1)


if __name__ == "__main__":
    main()
