"""The decode step's o and down projections with the residual add + RMSNorm after each, on the
GPU: cuBLAS (with the SiLU kernel before down, and the fused add + norm after) against the
split-K kernel whose partials the norm reduces (engine_kernels/linear_split_k.py), at the
decode-graph ladder's batch sizes, for Qwen3-0.6B's shapes.

Each candidate is timed as a CUDA graph of 28 calls over 28 copies of the weight, as the
layers of a decode step run, so the weights come from HBM and not from L2; cuBLAS with our
kernels launched the ordinary way and with programmatic dependent launch (engine_kernels/pdl.py),
the split-K kernel with it. It sweeps launch configurations and writes the best per shape as a
table that ENGINE_KERNELS_SPLIT_K_CONFIG takes (``--table``; ``splits=0`` where cuBLAS wins).

    python scripts/diag_split_k.py [--table split_k_table.json] [--batches 256,64,8]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics

import torch
import triton

from benchmarks.gpu_throughput import copy_bandwidth
from engine_kernels import triton_ops
from engine_kernels.linear_split_k import SplitKConfig, split_k_config, split_k_partials
from engine_kernels.rms_norm import partials_add_rms_norm

HIDDEN = 1024
SHAPES = {"o": (2048, False), "down": (3072, True)}  # name: (K, silu_gate)
BATCHES = (256, 224, 192, 160, 128, 96, 64, 48, 32, 24, 16, 8, 4, 2, 1)
LAYERS = 28


def _candidates(rows: int, k: int) -> list[SplitKConfig]:
    top = max(16, triton.next_power_of_2(rows))
    out = []
    for block_m in (16, 32, 64, 128):
        if block_m > top or block_m * 4 < top:
            continue
        for block_n in (32, 64, 128):
            for block_k, stages in ((128, 3), (64, 3), (64, 4)):
                tiles = triton.cdiv(HIDDEN, block_n) * triton.cdiv(rows, block_m)
                warps = 8 if block_m * block_n >= 8192 else 4
                for splits in (1, 2, 3, 4, 6, 8, 12, 16, 24):
                    depth = k // splits
                    if k % splits or depth % block_k or not 66 <= tiles * splits <= 132 * 8:
                        continue
                    out.append(SplitKConfig(block_n, block_m, block_k, splits, warps, stages))
    return out


def _per_call_us(fn, reps: int = 5) -> float:
    """Median over ``reps`` replays of a graph of ``LAYERS`` calls of ``fn(layer)``."""
    for layer in range(2):
        fn(layer)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(LAYERS):
            fn(layer)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / LAYERS)
    return statistics.median(times)


def _callers(x, weights, residual, norm_w, silu_gate):
    """``cublas(layer)`` and ``split_k(layer, config)``: the projection of ``x`` by layer
    ``layer``'s weight copy, then the residual add and norm."""

    def cublas(layer):
        h = triton_ops.silu_and_mul(x) if silu_gate else x
        y = torch.nn.functional.linear(h, weights[layer])
        return triton_ops.fused_add_rms_norm(y, residual, norm_w, 1e-6)

    def split_k(layer, cfg):
        parts = split_k_partials(x, weights[layer], silu_gate=silu_gate, config=cfg)
        return partials_add_rms_norm(parts, residual, norm_w, 1e-6)

    return cublas, split_k


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", help="write the best configuration per shape here (JSON)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, copy {bw / 1e9:,.0f} GB/s; us per call, each a CUDA "
          f"graph of {LAYERS} calls over {LAYERS} weight copies; floor: weights + activations "
          "at the copy rate")  # fmt: skip
    print("| projection | M | floor | cuBLAS (+SiLU) + add&norm | the same, PDL | split-K, "
          "table default | best split-K | its configuration | best / cuBLAS PDL |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    table, totals = [], {}
    for name, (k, silu_gate) in SHAPES.items():
        weights = [torch.randn(HIDDEN, k, dtype=dt, device=dev) / k**0.5 for _ in range(LAYERS)]
        norm_w = torch.rand(HIDDEN, dtype=dt, device=dev) + 0.5
        for rows in map(int, args.batches.split(",")):
            x = torch.randn(rows, 2 * k if silu_gate else k, dtype=dt, device=dev)
            residual = torch.randn(rows, HIDDEN, dtype=dt, device=dev)
            h = triton_ops.silu_and_mul(x) if silu_gate else x
            ref = (h.float() @ weights[0].float().t()).to(dt).float() + residual.float()

            cublas, split_k = _callers(x, weights, residual, norm_w, silu_gate)
            os.environ["ENGINE_KERNELS_PDL"] = "0"
            plain = _per_call_us(cublas)
            os.environ["ENGINE_KERNELS_PDL"] = "1"
            base = _per_call_us(cublas)
            default_cfg = split_k_config(rows, k)
            default = _per_call_us(functools.partial(split_k, cfg=default_cfg))
            best = (default, default_cfg)
            for cfg in _candidates(rows, k):
                try:
                    summed = split_k(0, cfg)[1].float()
                    err = ((summed - ref).norm() / ref.norm()).item()
                    assert err < 1e-2, f"relative error {err:.3g}"
                    us = _per_call_us(functools.partial(split_k, cfg=cfg))
                except Exception as e:  # noqa: BLE001 (a configuration that does not fit: skip)
                    print(f"  {name} M={rows} {cfg}: {type(e).__name__} {str(e)[:80]}")
                    continue
                best = min(best, (us, cfg), key=lambda t: t[0])
            floor = (HIDDEN * k + x.numel() + 2 * residual.numel()) * 2 / bw * 1e6
            totals[(name, rows)] = (plain, base, default, best[0])
            cfg_text = ", ".join(f"{f.name}={getattr(best[1], f.name)}"
                                 for f in dataclasses.fields(best[1]))  # fmt: skip
            print(f"| {name} | {rows} | {floor:.1f} | {plain:.1f} | {base:.1f} | {default:.1f} "
                  f"| {best[0]:.1f} | {cfg_text} | {best[0] / base:.2f} |", flush=True)  # fmt: skip
            chosen = best[1] if best[0] < base else dataclasses.replace(best[1], splits=0)
            table.append({"k": k, "max_rows": rows, **dataclasses.asdict(chosen)})
    for rows in sorted({r for _, r in totals}, reverse=True):
        plain, base, default, best = (
            sum(totals[(n, rows)][i] for n in SHAPES) * LAYERS for i in range(4)
        )
        print(
            f"M={rows}: o + down over {LAYERS} layers: cuBLAS {plain:.0f} us, with PDL "
            f"{base:.0f} us, split-K default {default:.0f} us, best {best:.0f} us per step"
        )
    if args.table:
        table.sort(key=lambda e: (e["k"], e["max_rows"]))
        with open(args.table, "w") as f:
            json.dump(table, f)
        print(f"table of {len(table)} shapes written to {args.table}")


if __name__ == "__main__":
    main()
