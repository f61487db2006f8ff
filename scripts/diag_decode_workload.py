"""The decode attention on the throughput benchmark's own steps (benchmarks/gpu_throughput.py):
for every 32nd decode step of the workload, the live batch and its context lengths, the time of
the step's decode attention per variant, and the sum over the run (each sampled step standing
for 32). Shows where a variant loses bandwidth: full batches or the drained tail.

Timed as the engine runs it: one CUDA graph per step and variant holds the 28 layers' attention
launches (attention + reduction), over ``--caches`` layers' caches in turn (4: no layer finds
the previous one's context in L2; 28: every layer its own, as in the engine, whose KV cache
spans tens of GB); the graph's replay time (median of 5) is the step's. ``--pages random``
places each page at random, ``sequential`` gives each sequence a contiguous run. A variant is a
KV cache layout (``token``: ``[blocks, page, KVH, D]`` contiguous, the engine's on CUDA;
``head``: head-major, its layout on the CPU) and a plan (programs per SM, chunks a KV head left
out, launch overrides). Names have no commas: ``--variants`` is comma-separated.

    python scripts/diag_decode_workload.py [--every 32] [--caches 4] [--pages random]
        [--variants "token 4/SM,token 3/SM"] [--best PATH]

``--best`` writes the fastest token-major variant over the run as the engine's decode config
(the JSON of ``REFERENCE_ENGINE_DECODE_CONFIG``, its programs per SM included; ``{}`` when the
default is fastest), for an end-to-end comparison (``scripts/device_release.sh``'s
``decode_ab``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from pathlib import Path

import torch
import triton.testing

from benchmarks.gpu_throughput import workload
from engine_kernels import triton_ops as tops
from engine_kernels.decode_split import DecodePlan, plan_workspace_numel

H, KVH, D, PAGE, LAYERS, WIDTH = 16, 8, 128, 16, 28, 256

DEFAULT = "token 4/SM"  # the engine's default on CUDA
# name -> (layout, programs per SM, plan config)
VARIANTS = {
    DEFAULT: ("token", 4, {}),
    "head 4/SM": ("head", 4, {}),
    "token 3/SM": ("token", 3, {}),
    # One chunk a KV head fewer than 4/SM fills (65 x 8 programs for 4 x 132 slots on an H100):
    # 4/SM lost 5 to 17% at the steps where all 66 chunks carried work (2026-12-07 15:09).
    "token 4/SM spare 1": ("token", 4, {"spare": 1}),
    "token 4/SM 32-token tiles": ("token", 4, {"block_n": 32}),
}
assert not any("," in name for name in VARIANTS)


def graph_ms(fn, replays: int = 5) -> float:
    """Median replay time of a CUDA graph of ``fn`` (compiled and warmed first)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cache_blocks(plens: list[int], outs: list[int]) -> int:
    """Pages enough for the workload's most live tokens at any decode step, with room to spare."""
    most = max(sum(p + t for p, o in zip(plens, outs) if o > t) for t in range(max(outs)))
    return -(-most // PAGE) + 256 * 2


def page_tables(lens: list[int], order: torch.Tensor, dev) -> torch.Tensor:
    """Block tables (``[len(lens), WIDTH]``) giving the sequences their pages from ``order``."""
    need = torch.tensor([-(-x // PAGE) for x in lens], device=dev)
    tables = torch.zeros(len(lens), WIDTH, dtype=torch.int32, device=dev)
    used = torch.arange(WIDTH, device=dev)[None, :] < need[:, None]
    tables[used] = order[: int(need.sum())].to(device=dev, dtype=torch.int32)
    return tables


def run_layers(caches, q, tables, seq_lens, plan, workspace, out) -> None:
    """One step's decode attention: ``LAYERS`` launches, over the layers' caches in turn."""
    for layer in range(LAYERS):
        kc, vc = caches[layer % len(caches)]
        tops.paged_attention_decode(q, kc, vc, tables, seq_lens, 0.088, plan=plan,
                                    workspace=workspace, out=out)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=int, default=32)
    ap.add_argument("--caches", type=int, default=4, help="distinct layers' caches (<= 28)")
    ap.add_argument("--pages", choices=["random", "sequential"], default="random")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="names, comma-separated")
    ap.add_argument("--best", type=Path, help="write the fastest variant's engine config here")
    args = ap.parse_args()
    names = args.variants.split(",")
    unknown = set(names) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {list(VARIANTS)}")
    dev = torch.device("cuda")
    prompts, outs = workload(256)
    plens = [len(p) for p in prompts]
    nb = cache_blocks(plens, outs)
    layouts = {VARIANTS[name][0] for name in names}
    caches = {"token": [], "head": []}
    for _ in range(args.caches):
        kc = torch.randn(nb, PAGE, KVH, D, dtype=torch.bfloat16, device=dev)
        vc = torch.randn_like(kc)
        if "head" in layouts:
            head = [torch.empty(nb, KVH, PAGE, D, dtype=kc.dtype, device=dev).transpose(1, 2)
                    for _ in range(2)]  # fmt: skip
            head[0].copy_(kc)
            head[1].copy_(vc)
            caches["head"].append(tuple(head))
        if "token" in layouts:
            caches["token"].append((kc, vc))
    buf = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    copy_ms = triton.testing.do_bench(functools.partial(buf[1 << 29 :].copy_, buf[: 1 << 29]))
    bandwidth = 2 * (1 << 29) / copy_ms / 1e6  # GB/s, bytes read + written
    del buf
    plans, wss = {}, {}
    for name in names:
        _, per_sm, config = VARIANTS[name]
        plans[name] = DecodePlan.from_config(256, KVH, dev, {**config, "per_sm": per_sm})
        wss[name] = torch.empty(plan_workspace_numel(plans[name].max_items, H, D), device=dev)
    print(f"{torch.cuda.get_device_name(dev)}; copy {bandwidth:,.0f} GB/s; {nb} blocks x "
          f"{args.caches} layers' caches, {args.pages} pages; one step's {LAYERS} layers in a "
          "CUDA graph")  # fmt: skip
    print("| step | live | tokens | GB | " + " | ".join(f"{n} ms (% copy)" for n in names) + " |")
    print("|---:|---:|---:|---:|" + "---:|" * len(names))
    totals = dict.fromkeys(names, 0.0)
    ideal = 0.0
    for t in range(0, max(outs), args.every):
        lens = [p + t + 1 for p, o in zip(plens, outs) if o > t]
        n = len(lens)
        order = torch.randperm(nb, device=dev) if args.pages == "random" else torch.arange(nb)
        perm = page_tables(lens, order, dev)
        seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        q = torch.randn(n, H, D, dtype=torch.bfloat16, device=dev)
        out = torch.empty_like(q)
        nbytes = sum(lens) * KVH * D * 2 * 2 * LAYERS
        ref = None
        cells = []
        for name in names:
            layout = VARIANTS[name][0]
            plan = plans[name]
            plan.fill(lens)
            plan.device.copy_(plan.host)

            ms = graph_ms(functools.partial(
                run_layers, caches[layout], q, perm, seq_lens, plan, wss[name], out
            ))  # fmt: skip
            got = out.float()
            ref = got if ref is None else ref
            err = ((got - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (name, t, err)
            totals[name] += ms * args.every / 1e3
            cells.append(f"{ms:.2f} ({nbytes / ms / 1e6 / bandwidth:.0%})")
        ideal += nbytes / (bandwidth * 1e9) * args.every
        print(f"| {t} | {n} | {sum(lens)} | {nbytes / 1e9:.1f} | " + " | ".join(cells) + " |",
              flush=True)  # fmt: skip
    print(f"\nrun estimate: at copy bandwidth {ideal:.2f} s; "
          + "; ".join(f"{k} {v:.2f} s ({ideal / v:.0%})" for k, v in totals.items()))  # fmt: skip
    if args.best:
        # The engine's cache on CUDA is token-major.
        best = min((n for n in totals if VARIANTS[n][0] == "token"), key=totals.get)
        _, per_sm, config = VARIANTS[best]
        engine_config = {} if best == DEFAULT else {**config, "per_sm": per_sm}
        args.best.write_text(json.dumps(engine_config))
        print(f"fastest: {best} -> REFERENCE_ENGINE_DECODE_CONFIG='{json.dumps(engine_config)}'")


if __name__ == "__main__":
    main()
