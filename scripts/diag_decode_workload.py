"""The decode attention on the throughput benchmark's own steps (benchmarks/gpu_throughput.py):
for every 32nd decode step of the workload, the live batch and its context lengths, the time of
one layer's decode attention per variant, and the sum over the run (x 28 layers, each sampled
step standing for 32). Shows where the kernel loses bandwidth: full batches or the drained tail.

    python scripts/diag_decode_workload.py [--every 32]
"""

from __future__ import annotations

import argparse
import functools

import torch
import triton.testing

from benchmarks.gpu_throughput import workload
from engine_kernels import triton_ops as tops
from engine_kernels.decode_split import DecodePlan, plan_workspace_numel

H, KVH, D, PAGE, LAYERS, WIDTH = 16, 8, 128, 16, 28, 256


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=32)
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    prompts, outs = workload(256)
    plens = [len(p) for p in prompts]
    most = max(sum(p + t for p, o in zip(plens, outs) if o > t) for t in range(max(outs)))
    nb = -(-most // PAGE) + 256 * 2
    kc = torch.randn(nb, PAGE, KVH, D, dtype=torch.bfloat16, device=dev)
    vc = torch.randn_like(kc)
    buf = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    copy_ms = triton.testing.do_bench(functools.partial(buf[1 << 29 :].copy_, buf[: 1 << 29]))
    bandwidth = 2 * (1 << 29) / copy_ms / 1e6  # GB/s, bytes read + written
    del buf
    # name -> (programs per SM, or None for the split decode; config overrides)
    variants = {
        "planned 4/SM unfused 64/4w/2st (old default)": (4, {"fused": 0}),
        "fused 4/SM 64/4w/2st": (4, {}),
        "fused 3/SM 64/4w/2st": (3, {}),
        "fused 3/SM 64/4w/3st": (3, {"num_stages": 3}),
        "fused 4/SM 32/4w/3st": (4, {"block_n": 32, "num_stages": 3}),
        "fused 4/SM 32/4w/2st": (4, {"block_n": 32}),
        "fused 8/SM 32/4w/3st": (8, {"block_n": 32, "num_stages": 3}),
        "fused 2/SM 64/8w/3st": (2, {"num_warps": 8, "num_stages": 3}),
        "unfused 3/SM 64/4w/3st": (3, {"fused": 0, "num_stages": 3}),
        "split (default)": (None, {}),
    }
    per_sm = sorted({v[0] for v in variants.values() if v[0] is not None})
    plans = {k: DecodePlan(256, k * sms // KVH, dev) for k in per_sm}
    wss = {k: torch.empty(plan_workspace_numel(p.max_items, H, D), device=dev)
           for k, p in plans.items()}  # fmt: skip
    names = list(variants)
    print(f"copy {bandwidth:,.0f} GB/s; {nb} blocks; times: one layer, do_bench median (cold L2)")
    print("| step | live | tokens | MB | " + " | ".join(f"{n} us (% copy)" for n in names) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * len(names))
    totals = dict.fromkeys(names, 0.0)
    ideal = 0.0
    for t in range(0, max(outs), args.every):
        lens = [p + t + 1 for p, o in zip(plens, outs) if o > t]
        n = len(lens)
        need = torch.tensor([-(-x // PAGE) for x in lens], device=dev)
        perm = torch.zeros(n, WIDTH, dtype=torch.int32, device=dev)  # pages in random order
        used = torch.arange(WIDTH, device=dev)[None, :] < need[:, None]
        perm[used] = torch.randperm(nb, device=dev)[: int(need.sum())].to(torch.int32)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        q = torch.randn(n, H, D, dtype=torch.bfloat16, device=dev)
        nbytes = sum(lens) * KVH * D * 2 * 2
        cells = []
        for name in names:
            plan_name, config = variants[name]
            kwargs = {}
            if plan_name is not None:
                plan = plans[plan_name]
                plan.fill(lens)
                plan.device.copy_(plan.host)
                kwargs = {"plan": plan, "workspace": wss[plan_name], "config": config}
            elif config:
                kwargs = {"config": config}
            fn = functools.partial(
                tops.paged_attention_decode, q, kc, vc, perm, seq_lens, 0.088, **kwargs
            )
            if name == names[0]:
                ref = fn().float()
            err = ((fn().float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, t, err)
            ms = triton.testing.do_bench(fn, return_mode="median")
            totals[name] += ms * args.every * LAYERS / 1e3
            cells.append(f"{ms * 1e3:.0f} ({nbytes / ms / 1e6 / bandwidth:.0%})")
        ideal += nbytes / (bandwidth * 1e9) * args.every * LAYERS
        print(f"| {t} | {n} | {sum(lens)} | {nbytes / 1e6:.0f} | " + " | ".join(cells) + " |",
              flush=True)  # fmt: skip
    print(f"\nrun estimate (28 layers): at copy bandwidth {ideal:.2f} s; "
          + "; ".join(f"{k} {v:.2f} s ({ideal / v:.0%})" for k, v in totals.items()))  # fmt: skip


if __name__ == "__main__":
    main()
