"""The decode graph's matrix products on the H200: cuBLAS (``F.linear``) against a plain Triton
GEMM at the batch sizes of the decode-graph ladder, for Qwen3-0.6B's projections, timed as CUDA
graph replays (``do_bench_cudagraph``), with each shape's byte and FLOP floors.

    python scripts/diag_decode_gemm.py [--no-triton]

Also times ``F.linear`` with cuBLASLt preferred (``torch.backends.cuda.preferred_blas_library``),
which picks its kernels (split-K among them) by its own heuristics.
"""

from __future__ import annotations

import argparse
import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072),
          "lm_head": (151936, 1024)}  # fmt: skip
BATCHES = (256, 192, 128, 64, 32, 8)
CONFIGS = [(64, 64, 128, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 8, 3),
           (64, 256, 64, 8, 3), (128, 256, 64, 8, 3), (32, 64, 128, 4, 5)]  # fmt: skip


@triton.jit
def _gemm(a_ptr, w_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c[M, N] = a[M, K] @ w[N, K]^T, all row-major bf16; the N tile is the fastest axis so
    that programs running together share their rows of ``a`` in L2."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a = a_ptr + rm[:, None].to(tl.int64) * K + rk[None, :]
    w = w_ptr + rn[:, None].to(tl.int64) * K + rk[None, :]
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        x = tl.load(a + k0, mask=(rm < M)[:, None], other=0.0)
        y = tl.load(w + k0, mask=(rn < N)[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(y), acc)
    c = c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


def triton_linear(a, w, out, cfg):
    bm, bn, bk, warps, stages = cfg
    grid = (triton.cdiv(w.shape[0], bn), triton.cdiv(a.shape[0], bm))
    _gemm[grid](a, w, out, a.shape[0], w.shape[0], a.shape[1], BM=bm, BN=bn, BK=bk,
                num_warps=warps, num_stages=stages)  # fmt: skip
    return out


def _linear_us(a, w, blas: str) -> float:
    torch.backends.cuda.preferred_blas_library(blas)
    try:
        return triton.testing.do_bench_cudagraph(functools.partial(F.linear, a, w), rep=100) * 1e3
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-triton", action="store_true", help="time cuBLAS and cuBLASLt only")
    args = ap.parse_args()
    configs = [] if args.no_triton else CONFIGS
    dev = torch.device("cuda")
    buf = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    copy_ms = triton.testing.do_bench(functools.partial(buf[1 << 29 :].copy_, buf[: 1 << 29]))
    bw = 2 * (1 << 29) / copy_ms / 1e6
    del buf
    print(
        f"copy {bw:,.0f} GB/s; times in us, CUDA-graph replays; floor = max(bytes / copy, "
        "FLOPs / 700 TFLOP/s)"
    )
    print("| shape | M | floor | cuBLAS | cuBLASLt | best Triton | config | Triton / cuBLAS |")
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    totals = {}
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, dtype=torch.bfloat16, device=dev) * 0.03
        for m in BATCHES:
            a = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
            out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            ref = F.linear(a, w)
            floor = max((n * k + m * k + m * n) * 2 / bw / 1e3, 2 * m * n * k / 700e12 * 1e6)
            cublas, lt = _linear_us(a, w, "cublas"), _linear_us(a, w, "cublaslt")
            best = (float("inf"), None)
            for cfg in configs:
                try:
                    triton_linear(a, w, out, cfg)
                    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                    assert err < 2e-2, err
                    fn = functools.partial(triton_linear, a, w, out, cfg)
                    us = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
                except Exception as e:  # noqa: BLE001 (a config that does not fit: skip it)
                    print(f"  {name} M={m} {cfg}: {type(e).__name__} {str(e)[:60]}")
                    continue
                best = min(best, (us, cfg))
            totals[(name, m)] = (cublas, lt, best[0])
            print(
                f"| {name} | {m} | {floor:.1f} | {cublas:.1f} | {lt:.1f} | {best[0]:.1f} | "
                f"{best[1]} | {best[0] / cublas:.2f} |",
                flush=True,
            )
    for m in BATCHES:
        c = sum(v[0] for (s, mm), v in totals.items() if mm == m and s != "lm_head") * 28
        lt = sum(v[1] for (s, mm), v in totals.items() if mm == m and s != "lm_head") * 28
        t = sum(min(v) for (s, mm), v in totals.items() if mm == m and s != "lm_head") * 28
        print(
            f"M={m}: 28 layers cuBLAS {c:.0f} us, cuBLASLt {lt:.0f} us, best of all {t:.0f} us "
            "per step"
        )


if __name__ == "__main__":
    main()
