"""Planned decode attention in the engine's shapes on CUDA: error and time against the split
decode (python scripts/diag_decode_plan.py STAGES LENS), one variant per process."""

import sys

import torch
import triton.testing

from kernels import reference
from kernels import triton_ops as tops
from kernels.decode_split import DecodePlan, default_plan_programs, plan_workspace_numel

stages, kind = int(sys.argv[1]), sys.argv[2]
B, H, KVH, D, nb = 256, 16, 8, 128, 40000
dev = torch.device("cuda")
kc = torch.randn(nb, 16, KVH, D, dtype=torch.bfloat16, device=dev)
vc = torch.randn_like(kc)
g = torch.Generator().manual_seed(0)
lens_list = [1] * B if kind == "ones" else torch.randint(100, 2048, (B,), generator=g).tolist()
tables = torch.randperm(nb, device=dev)[: B * 128].view(B, 128).to(torch.int32)
tables = torch.cat([tables, tables], 1)
lens = torch.tensor(lens_list, dtype=torch.int32, device=dev)
q = torch.randn(B, H, D, dtype=torch.bfloat16, device=dev)
plan = DecodePlan(B, default_plan_programs(KVH, dev), dev)
plan.fill(lens_list)
plan.device.copy_(plan.host)
ws = torch.empty(plan_workspace_numel(plan.max_items, H, D), device=dev)
cfg = {"num_stages": stages}
out = tops.paged_attention_decode(
    q, kc, vc, tables, lens, 0.08, plan=plan, workspace=ws, config=cfg
)
torch.cuda.synchronize()
ref = reference.paged_attention_decode(q, kc, vc, tables, lens, 0.08)
err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
nbytes = sum(lens_list) * KVH * D * 2 * 2
ms = triton.testing.do_bench(lambda: tops.paged_attention_decode(
    q, kc, vc, tables, lens, 0.08, plan=plan, workspace=ws, config=cfg), return_mode="median")
ms_old = triton.testing.do_bench(lambda: tops.paged_attention_decode(
    q, kc, vc, tables, lens, 0.08, config=cfg), return_mode="median")
print(f"stages={stages} lens={kind}: err {err:.1e}; planned {ms * 1e3:.0f} us "
      f"{nbytes / ms / 1e6:.0f} GB/s; split(default) {ms_old * 1e3:.0f} us "
      f"{nbytes / ms_old / 1e6:.0f} GB/s")
