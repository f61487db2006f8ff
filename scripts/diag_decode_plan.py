"""Planned decode attention in the engine's shapes on CUDA (256 sequences, 16 / 8 heads of 128,
bf16, 16-token pages in random order): error against the reference and time of each kernel
configuration and program count, against the split decode. One process, a table on stdout.

    python scripts/diag_decode_plan.py [LENS]   # LENS: random (100..2048, default), ones, 1024
"""

import itertools
import sys

import torch
import triton.testing

from engine_kernels import reference
from engine_kernels import triton_ops as tops
from engine_kernels.decode_split import DecodePlan, plan_workspace_numel

kind = sys.argv[1] if len(sys.argv) > 1 else "random"
B, H, KVH, D, nb = 256, 16, 8, 128, 40000
dev = torch.device("cuda")
sms = torch.cuda.get_device_properties(dev).multi_processor_count
kc = torch.randn(nb, 16, KVH, D, dtype=torch.bfloat16, device=dev)
vc = torch.randn_like(kc)
g = torch.Generator().manual_seed(0)
if kind == "ones":
    lens_list = [1] * B
elif kind == "random":
    lens_list = torch.randint(100, 2048, (B,), generator=g).tolist()
else:
    lens_list = [int(kind)] * B
tables = torch.randperm(nb, device=dev)[: B * 128].view(B, 128).to(torch.int32)
tables = torch.cat([tables, tables], 1)  # a table wider than any context, as in the engine
lens = torch.tensor(lens_list, dtype=torch.int32, device=dev)
q = torch.randn(B, H, D, dtype=torch.bfloat16, device=dev)
ref = reference.paged_attention_decode(q, kc, vc, tables, lens, 0.08).double()
nbytes = sum(lens_list) * KVH * D * 2 * 2
copy = torch.empty(1 << 28, dtype=torch.uint8, device=dev)
copy_ms = triton.testing.do_bench(lambda: copy[1 << 27 :].copy_(copy[: 1 << 27]))
bandwidth = 2 * (1 << 27) / copy_ms / 1e6  # GB/s, bytes read + written
print(
    f"lens={kind}: {sum(lens_list)} tokens, {nbytes / 1e9:.2f} GB of K/V; copy {bandwidth:.0f} GB/s"
)
print("| kernel | programs per SM | block_n | warps | stages | err | us | GB/s | % of copy |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(name, per_sm, cfg, fn):
    try:
        out = fn()
        torch.cuda.synchronize()
        err = ((out.double() - ref).norm() / ref.norm()).item()
        ms = triton.testing.do_bench(fn, return_mode="median")
    except Exception as exc:  # a configuration that does not compile or fit: say so, go on
        print(f"| {name} | {per_sm} | {cfg} | failed: {type(exc).__name__}: {exc} |")
        return
    gbs = nbytes / ms / 1e6
    print(
        f"| {name} | {per_sm} | {cfg['block_n']} | {cfg['num_warps']} | {cfg['num_stages']} "
        f"| {err:.1e} | {ms * 1e3:.0f} | {gbs:,.0f} | {gbs / bandwidth:.0%} |",
        flush=True,
    )


default = {"block_n": 64, "num_warps": 4, "num_stages": 3}
row(
    "split (default splits)",
    "",
    default,
    lambda: tops.paged_attention_decode(q, kc, vc, tables, lens, 0.08, config=default),
)


def make_planned(plan, ws, cfg):
    return lambda: tops.paged_attention_decode(
        q, kc, vc, tables, lens, 0.08, plan=plan, workspace=ws, config=cfg
    )


for per_sm, (block_n, warps, stages) in itertools.product(
    (4, 8, 16), ((64, 4, 3), (64, 4, 2), (64, 8, 3), (32, 4, 3), (32, 4, 4), (64, 4, 4))
):
    plan = DecodePlan(B, per_sm * sms // KVH, dev)
    plan.fill(lens_list)
    plan.device.copy_(plan.host)
    ws = torch.empty(plan_workspace_numel(plan.max_items, H, D), device=dev)
    cfg = {"block_n": block_n, "num_warps": warps, "num_stages": stages}
    row("planned", per_sm, cfg, make_planned(plan, ws, cfg))
