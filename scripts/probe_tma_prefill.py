"""Does the TMA prefill kernel return on this GPU, for one configuration, and is it right? Causal
bf16 sequences of the given lengths (several lengths leave some programs with no key tile: the
engine's mixed steps do), checked against SDPA. It says when the launch returned (the compile is
done; the kernel is queued) and when the GPU finished, so a hang shows which of the two never
came. A hung kernel never gives control back: run each configuration in its own process under
`timeout` (scripts/device_tma_probe.sh does, all at once; with TIME=1 it then times, one at a
time, those that came back right).

    ENGINE_KERNELS_TMA_PREFILL=1 timeout 60 python3 scripts/probe_tma_prefill.py \
        128 128 128 4 2 1 --lens 512,100 [--time]

``--time`` also times the configuration on the kernel benchmark's prefill shape (8 x 4096
tokens, 16 heads) against the fastest SDPA backend (alone on the GPU, or the times mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine_kernels import paged_attention_prefill_tma as tma  # noqa: E402
from engine_kernels.ops import TMA_PREFILL_OPT_IN  # noqa: E402

TOLERANCE = 5e-2  # bf16 outputs of unit-variance inputs; a wrong tile is off by ~1


def check(head_dim: int, cfg: dict, lens: list[int]) -> float:
    heads, kv_heads = 16, 8
    tokens = sum(lens)
    q = torch.randn(tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tokens, kv_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    seq_lens = torch.tensor(lens, device="cuda", dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda",
                       dtype=torch.int32)  # fmt: skip
    start = time.perf_counter()
    tma.attend_fresh(q, k, v, seq_lens, qsl, head_dim**-0.5, max_query_len=max(lens), out=out,
                     config=cfg)  # fmt: skip
    print(f"  launch returned in {time.perf_counter() - start:.1f} s (compile included)",
          flush=True)  # fmt: skip
    torch.cuda.synchronize()
    print(f"  GPU finished {time.perf_counter() - start:.1f} s after the launch", flush=True)
    err = 0.0
    for s, n in zip(qsl.tolist(), lens):
        qs, ks, vs = (t[s : s + n].transpose(0, 1) for t in (q, k, v))
        expect = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        diff = (out[s : s + n] - expect.transpose(0, 1)).float().abs()
        err = max(err, diff.nan_to_num(nan=float("inf")).max().item())  # NaN: a row left unwritten
    return err


def timed(head_dim: int, cfg: dict) -> str:
    from benchmarks.kernels import _prefill_inputs, _run_prefill, bench, fastest_sdpa

    (batch, heads, length, _), (q4, k4, v4), inputs = _prefill_inputs(head_dim)
    scale = head_dim**-0.5
    peer, peer_ms, _ = fastest_sdpa(
        lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)
    )
    ms = bench(lambda: _run_prefill(inputs, length, scale, "tma", cfg))
    flops = 4 * batch * heads * head_dim * length * (length + 1) / 2
    return (f"{batch}x{length} tok: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s, "
            f"{peer_ms / ms:.2f}x {peer} ({peer_ms:.3f} ms)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "config", type=int, nargs="+", metavar="N",
        help="head_dim, then the configuration's values in the order of the kernel module's "
        f"CONFIG_KEYS ({' '.join(tma.CONFIG_KEYS)}); those left out are 0. ws 1: warp-"
        "specialised; peel 1: the diagonal tiles peeled after the loop; gluon 2: the Gluon "
        "kernel, as 4 2 0 1 2; heads_fastest 1: the programs launched heads fastest; maxnreg: "
        "a cap on registers per thread",
    )  # fmt: skip
    parser.add_argument("--lens", default="512", help="comma-separated sequence lengths")
    parser.add_argument("--time", action="store_true")
    args = parser.parse_args()
    if os.environ.get(TMA_PREFILL_OPT_IN) != "1":
        sys.exit(f"set {TMA_PREFILL_OPT_IN}=1: the kernel is opt-in on CUDA")
    if not 3 <= len(args.config) <= 1 + len(tma.CONFIG_KEYS):
        parser.error(f"give head_dim and 2 to {len(tma.CONFIG_KEYS)} values of CONFIG_KEYS")
    head_dim, *values = args.config
    cfg = tma._cfg(*values, *[0] * (len(tma.CONFIG_KEYS) - len(values)))
    name = f"d{head_dim} {tma.config_name(cfg)}"
    print(f"{name} lens {args.lens}:", flush=True)
    err = check(head_dim, cfg, [int(n) for n in args.lens.split(",")])
    verdict = "right" if err <= TOLERANCE else "WRONG"
    print(f"{name}: {verdict}, max abs err {err:.1e} against SDPA", flush=True)
    if err > TOLERANCE:
        sys.exit(1)
    if args.time:
        print(f"{name}: {timed(head_dim, cfg)}", flush=True)


if __name__ == "__main__":
    main()
