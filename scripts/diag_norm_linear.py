"""The norms inside the projections after them (engine_kernels/norm_linear.py) against the layer
as it was (the o and down projections split-K or cuBLAS with the add + norm after them, cuBLAS
for qkv and gate/up, the SiLU kernel), on the GPU, for Qwen3-0.6B's shapes.

Part one sweeps each fused kernel's launches (qkv: N = 4096; gate/up + SiLU: N = 3072 x 2; K =
1024), each timed as a CUDA graph of 28 calls over 28 weight copies, as a decode step's layers
run them (weights from HBM, not L2), and writes the best per batch size as a table that
ENGINE_KERNELS_NORM_LINEAR_CONFIG takes (``--table``). Part two times a decode step's 28 layers
without the attention (the same in both), before and after, each as one CUDA graph, with that
table, and a third way with the q/k norm, rotary embedding and KV store inside the qkv kernel
too (engine_kernels/norm_qkv_rope_store.py; ENGINE_KERNELS_NORM_LINEAR=rope in the engine), and
checks that all give the same residual stream and query within rounding.

    python scripts/diag_norm_linear.py [--table norm_linear.json] [--batches 256,64,8]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_kernels import reference, triton_ops  # noqa: E402
from engine_kernels.norm_linear import (  # noqa: E402
    CONFIG_OVERRIDE,
    NormLinearConfig,
    norm_linear,
    norm_linear_config,
    num_warps_for,
)
from engine_kernels.norm_qkv_rope_store import launch_for  # noqa: E402
from reference_engine.models.rope import cos_sin_cache as reference_rope  # noqa: E402
from scripts.diag_decode_workload import graph_ms  # noqa: E402

HIDDEN, INTER, QKV, ATTN = 1024, 3072, 4096, 2048
HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
BATCHES = (256, 192, 128, 96, 64, 32, 16, 8, 1)
LAYERS = 28
BF16 = torch.bfloat16


def _graph_us(fn) -> float:
    """Median replay time of a CUDA graph of ``fn()``, in microseconds."""
    return graph_ms(fn) * 1e3


def _candidates(rows: int, silu_gate: bool) -> list[NormLinearConfig]:
    top = max(16, triton.next_power_of_2(rows))
    out = []
    for block_m in (16, 32, 64, 128):
        if block_m > top or block_m * 4 < top:
            continue
        for block_n in (32, 64, 128):
            for block_k, stages in ((128, 3), (64, 3), (64, 4)):
                warps = num_warps_for(block_n, block_m, silu_gate)
                out.append(NormLinearConfig(block_n, block_m, block_k, warps, stages))
    return out


def _timings(rows: int, candidates, once, timed, ref: torch.Tensor) -> dict:
    """``{launch: us}`` for each candidate whose output ``once(cfg)`` is ``ref`` within bf16
    rounding, timed by ``timed(cfg)``; a launch that fails or is wrong is reported and left out."""
    out = {}
    for cfg in candidates:
        try:
            got = once(cfg).float()
            err = ((got - ref.float()).norm() / ref.float().norm()).item()
            assert err < 2e-2, f"relative error {err:.3g}"
            out[cfg] = timed(cfg)
        except Exception as e:  # noqa: BLE001 (a launch that does not fit: skip it)
            print(f"  M={rows} {cfg}: {type(e).__name__} {str(e)[:80]}")
    return out


def _text(cfg: NormLinearConfig) -> str:
    return ", ".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))


def sweep(batches: list[int], dev) -> list[dict]:
    """Part one: the best launch per kernel and batch size, as table entries."""
    print("| kernel | M | separate kernels us | heuristic us | best us | its configuration "
          "| best / heuristic | best at block_n=128 us |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    table = []
    for silu_gate, n in ((False, QKV), (True, INTER)):
        weights = [torch.randn(2 * n if silu_gate else n, HIDDEN, dtype=BF16, device=dev)
                   * HIDDEN**-0.5 for _ in range(LAYERS)]  # fmt: skip
        norm_w = torch.rand(HIDDEN, dtype=BF16, device=dev) + 0.5
        for rows in batches:
            h = torch.randn(rows, HIDDEN, dtype=BF16, device=dev)
            residual = torch.randn(rows, HIDDEN, dtype=BF16, device=dev)

            def layers(cfg, h=h, residual=residual, norm_w=norm_w, weights=weights, gate=silu_gate):
                for w in weights:
                    norm_linear(h, residual, norm_w, 1e-6, w, silu_gate=gate, config=cfg)

            ref = reference.add_rms_norm_linear(
                h, residual, norm_w, 1e-6, weights[0], silu_gate=silu_gate
            )[0].float()

            def separate(h=h, residual=residual, norm_w=norm_w, weights=weights, gate=silu_gate):
                for w in weights:  # what the fused kernel replaces: above MAX_ROWS it runs so
                    x, _ = triton_ops.fused_add_rms_norm(h, residual, norm_w, 1e-6)
                    y = F.linear(x, w)
                    if gate:
                        triton_ops.silu_and_mul(y)

            unfused = _graph_us(separate)
            heuristic = norm_linear_config(rows, silu_gate)
            base = _graph_us(functools.partial(layers, heuristic))
            times = _timings(
                rows, _candidates(rows, silu_gate),
                lambda cfg, h=h, residual=residual, w=weights[0], norm_w=norm_w, g=silu_gate:
                    norm_linear(h, residual, norm_w, 1e-6, w, silu_gate=g, config=cfg)[0],
                lambda cfg, layers=layers: _graph_us(functools.partial(layers, cfg)), ref,
            )  # fmt: skip
            best = min([(base, heuristic), *((us, cfg) for cfg, us in times.items())],
                       key=lambda t: t[0])  # fmt: skip
            # the one-head-a-program tile that a q/k norm + rotary + store epilogue would need
            widest = min([us for cfg, us in times.items() if cfg.block_n == 128], default=base)
            name = "gate/up + SiLU" if silu_gate else "qkv"
            print(f"| {name} | {rows} | {unfused / LAYERS:.1f} | {base / LAYERS:.1f} "
                  f"| {best[0] / LAYERS:.1f} | {_text(best[1])} | {best[0] / base:.2f} "
                  f"| {widest / LAYERS:.1f} |", flush=True)  # fmt: skip
            table.append({"silu_gate": silu_gate, "max_rows": rows, **dataclasses.asdict(best[1])})
    return sorted(table, key=lambda e: (e["silu_gate"], e["max_rows"]))


def sweep_rope(batches: list[int], dev) -> None:
    """Part one and a half: the qkv kernel with the attention's input side inside it
    (engine_kernels/norm_qkv_rope_store.py), its launches per batch size, against the qkv
    kernel followed by the q/k norm + rotary + store kernel (what it replaces)."""
    print("\n| M | qkv kernel + rope kernel us | one kernel, default us | best us "
          "| its configuration | best / two kernels |")  # fmt: skip
    print("|---:|---:|---:|---:|---|---:|")
    weights = [torch.randn(QKV, HIDDEN, dtype=BF16, device=dev) * HIDDEN**-0.5
               for _ in range(LAYERS)]  # fmt: skip
    norm_w = torch.rand(HIDDEN, dtype=BF16, device=dev) + 0.5
    for rows in batches:
        h = torch.randn(rows, HIDDEN, dtype=BF16, device=dev)
        residual = torch.randn(rows, HIDDEN, dtype=BF16, device=dev)
        side = AttnInput.make(rows, dev)

        def two(h=h, residual=residual, side=side):
            for w in weights:
                side.store(norm_linear(h, residual, norm_w, 1e-6, w)[0])

        def one(cfg, h=h, residual=residual, side=side):
            for w in weights:
                triton_ops.add_rms_norm_qkv_rope_store(
                    h, residual, norm_w, 1e-6, w, None, *side.args(), side.q_norm, side.k_norm,
                    1e-6, config=cfg,
                )  # fmt: skip

        ref = side.store(norm_linear(h, residual, norm_w, 1e-6, weights[-1])[0])
        t_two = _graph_us(two)
        default = launch_for(rows, HEAD_DIM)
        t_default = _graph_us(functools.partial(one, default))
        top = max(16, triton.next_power_of_2(rows))
        candidates = [
            NormLinearConfig(HEAD_DIM // 2, block_m, block_k,
                             num_warps_for(HEAD_DIM // 2, block_m, True), stages)
            for block_m in (16, 32, 64) if block_m <= top and block_m * 4 >= top
            for block_k, stages in ((64, 3), (64, 4), (64, 6), (128, 3))
        ]  # fmt: skip
        times = _timings(
            rows, candidates,
            lambda cfg, h=h, residual=residual, side=side:
                triton_ops.add_rms_norm_qkv_rope_store(
                    h, residual, norm_w, 1e-6, weights[-1], None, *side.args(), side.q_norm,
                    side.k_norm, 1e-6, config=cfg,
                )[0],
            lambda cfg, one=one: _graph_us(functools.partial(one, cfg)), ref,
        )  # fmt: skip
        best = min([(t_default, default), *((us, cfg) for cfg, us in times.items())],
                   key=lambda t: t[0])  # fmt: skip
        print(f"| {rows} | {t_two / LAYERS:.1f} | {t_default / LAYERS:.1f} "
              f"| {best[0] / LAYERS:.1f} | {_text(best[1])} | {best[0] / t_two:.2f} |",
              flush=True)  # fmt: skip


def _weights(dev):
    shapes = [(QKV, HIDDEN), (HIDDEN, ATTN), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    return [tuple(torch.randn(o, i, dtype=BF16, device=dev) * i**-0.5 for o, i in shapes)
            for _ in range(LAYERS)]  # fmt: skip


@dataclasses.dataclass
class AttnInput:
    """What a decode step's attention input side needs besides qkv: Qwen3-0.6B's heads, the
    rotary cache, one layer's KV cache (every layer writes to it here), slots, q/k norms."""

    positions: torch.Tensor
    rope: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slots: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor

    @classmethod
    def make(cls, rows: int, dev) -> AttnInput:
        blocks = rows + 8  # one token a sequence, each in its own 16-slot block
        cache = (torch.zeros(blocks, 16, KV_HEADS, HEAD_DIM, dtype=BF16, device=dev) for _ in "kv")
        return cls(
            torch.randint(0, 4096, (rows,), device=dev),
            reference_rope(HEAD_DIM, 4096, 1e6, None).to(dev),
            *cache,
            torch.randperm(blocks, device=dev)[:rows] * 16,
            *(torch.rand(HEAD_DIM, dtype=BF16, device=dev) + 0.5 for _ in "qk"),
        )

    def args(self) -> tuple:
        return (self.positions, self.rope, self.k_cache, self.v_cache, self.slots, HEADS,
                KV_HEADS)  # fmt: skip

    def store(self, qkv: torch.Tensor) -> torch.Tensor:
        return triton_ops.qk_norm_rope_store(qkv, *self.args(), self.q_norm, self.k_norm, 1e-6)


def _before(embed, attn, weights, norms, side: AttnInput):
    """The layers as they were, without the attention; returns the residual stream and the last
    layer's query."""
    residual = embed
    x = triton_ops.rms_norm(residual, norms[0], 1e-6)
    for i, (w_qkv, w_o, w_gu, w_down) in enumerate(weights):
        q = side.store(F.linear(x, w_qkv))
        x, residual = triton_ops.projection_add_rms_norm(
            attn, w_o, residual, norms[2 * i + 1], 1e-6
        )
        x, residual = triton_ops.projection_add_rms_norm(
            F.linear(x, w_gu), w_down, residual, norms[2 * i + 2], 1e-6, silu_gate=True
        )
    return residual, q


def _after(embed, attn, weights, norms, side: AttnInput, rope_too: bool = False):
    """The layers with the norms inside the projections (and with ``rope_too`` the attention's
    input side inside the qkv kernel), without the attention."""
    h, residual = embed, None
    for i, (w_qkv, w_o, w_gu, w_down) in enumerate(weights):
        if rope_too:
            q, residual = triton_ops.add_rms_norm_qkv_rope_store(
                h, residual, norms[2 * i], 1e-6, w_qkv, None, *side.args(), side.q_norm,
                side.k_norm, 1e-6,
            )  # fmt: skip
        else:
            qkv, residual = triton_ops.add_rms_norm_linear(h, residual, norms[2 * i], 1e-6, w_qkv)
            q = side.store(qkv)
        act, residual = triton_ops.add_rms_norm_linear(
            F.linear(attn, w_o), residual, norms[2 * i + 1], 1e-6, w_gu, silu_gate=True
        )
        h = F.linear(act, w_down)
    return triton_ops.fused_add_rms_norm(h, residual, norms[-1], 1e-6)[1], q


def _error(got: tuple, ref: tuple) -> float:
    """The larger relative error of the residual stream and the last query."""
    return max(((g.float() - r.float()).norm() / r.float().norm()).item() for g, r in zip(got, ref))


def chains(batches: list[int], dev) -> None:
    """Part two: 28 layers without the attention, before and after, each one CUDA graph."""
    weights = _weights(dev)
    norms = [torch.rand(HIDDEN, dtype=BF16, device=dev) + 0.5 for _ in range(2 * LAYERS + 1)]
    print("\n| M | before us per step | after us per step | after / before "
          "| after, q/k norm + rotary + store in qkv too | / before | error |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows in batches:
        embed = torch.randn(rows, HIDDEN, dtype=BF16, device=dev)
        attn = torch.randn(rows, ATTN, dtype=BF16, device=dev) * 0.1  # the attention's output
        side = AttnInput.make(rows, dev)
        before = functools.partial(_before, embed, attn, weights, norms, side)
        after = functools.partial(_after, embed, attn, weights, norms, side)
        rope_too = functools.partial(_after, embed, attn, weights, norms, side, True)
        t_before, t_after, t_rope = _graph_us(before), _graph_us(after), _graph_us(rope_too)
        ref = before()
        err = max(_error(after(), ref), _error(rope_too(), ref))
        print(f"| {rows} | {t_before:.0f} | {t_after:.0f} | {t_after / t_before:.2f} "
              f"| {t_rope:.0f} | {t_rope / t_before:.2f} | {err:.1e} |", flush=True)  # fmt: skip
        assert err < 5e-2, f"M={rows}: the orders disagree beyond rounding ({err:.2e})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", help="write the best launch per kernel and batch size here (JSON)")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    print(f"{torch.cuda.get_device_name(dev)}; us, CUDA graphs of {LAYERS} layers, Qwen3-0.6B")
    table = sweep(batches, dev)
    if args.table:
        Path(args.table).write_text(json.dumps(table))
        print(f"table of {len(table)} launches written to {args.table}")
    os.environ[CONFIG_OVERRIDE] = json.dumps(table)
    sweep_rope(batches, dev)
    chains(batches, dev)


if __name__ == "__main__":
    main()
