"""The decode step's chain of GEMMs and attention, timed per way of running it.

The decode step's attention reads the KV cache at about copy bandwidth, while its narrow GEMMs
are latency-bound: cuBLAS runs the o and down projections at 3 to 6x their bandwidth floor, on a
few dozen CTAs, with weights that come from HBM (docs/performance.md, 2026-12-06). This times
ideas for that, on the throughput benchmark's own steps, each variant one CUDA graph of a step's
28 layers (Qwen3-0.6B's shapes: the qkv, o, gate-up and down projections in cuBLAS, SiLU-and-mul,
and the planned decode attention over the step's live context lengths; norms, rotary and the KV
store left out, the same in every variant):

- ``one stream``: the whole batch's chain, as the engine runs it today;
- ``one stream 3/SM``: the same with the attention planned for 3 programs per SM, not 4 (in
  ``diag_decode_workload.py`` 4 per SM lost 5 to 17% at the steps where every program had work,
  2026-12-07 15:09; does it here, where the attention follows a cuBLAS GEMM, which does not
  let it launch early? End to end, 3 per SM lost 3%, 16:29);
- ``one stream spare 1``: 4 per SM with one chunk a KV head fewer, some slots left free (here
  the three were within 1%, 16:38: the diag's dips came from PDL, docs/performance.md);
- ``halves in turn``: the batch cut in two halves whose chains run one after the other on one
  stream (what splitting costs without any overlap);
- ``two streams N/SM``: each half's chain on its own stream, its attention planned for N
  programs per SM (4: the engine's default, both halves contending; 2: half each): would one
  half's attention fill the SMs that the other half's GEMMs leave idle?

Two streams lost at every step (H100, 2026-12-07 00:25), and so did the attention prefetching
the layer's next weights into L2 (13:16; removed after it): docs/performance.md.

    python scripts/diag_decode_chain.py [--every 128] [--variants "one stream,two streams 4/SM"]

Each row also checks that every variant's hidden states are within rounding of one stream's
(cuBLAS may pick other tiles for another row count, and another plan cuts the attention
elsewhere; a stream that read its input before it was written would be far off).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_throughput import workload  # noqa: E402
from engine_kernels import triton_ops as tops  # noqa: E402
from engine_kernels.decode_split import DecodePlan, plan_workspace_numel  # noqa: E402
from scripts.diag_decode_workload import (  # noqa: E402
    KVH,
    LAYERS,
    PAGE,
    D,
    H,
    cache_blocks,
    graph_ms,
    page_tables,
)

HIDDEN, INTER = 1024, 3072  # Qwen3-0.6B's; its heads are diag_decode_workload's
BF16 = torch.bfloat16


def layer_weights(dev) -> list[tuple[torch.Tensor, ...]]:
    """Each layer's (qkv, o, gate-up, down) weights."""
    shapes = [((H + 2 * KVH) * D, HIDDEN), (HIDDEN, H * D), (2 * INTER, HIDDEN), (HIDDEN, INTER)]
    return [tuple(torch.randn(o, i, dtype=BF16, device=dev) * i**-0.5 for o, i in shapes)
            for _ in range(LAYERS)]  # fmt: skip


class Chain:
    """One batch's 28-layer decode chain over fixed buffers (a graph replays it)."""

    def __init__(
        self, weights, caches, lens: list[int], tables, dev, per_sm: int = 4, spare: int = 0
    ) -> None:
        n = len(lens)
        self.weights, self.caches, self.tables = weights, caches, tables
        self.seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
        self.plan = DecodePlan.from_config(n, KVH, dev, {"per_sm": per_sm, "spare": spare})
        self.plan.fill(lens)
        self.plan.device.copy_(self.plan.host)
        self.workspace = torch.empty(plan_workspace_numel(self.plan.max_items, H, D), device=dev)
        self.x = torch.empty(n, HIDDEN, dtype=BF16, device=dev)
        self.attn = torch.empty(n, H, D, dtype=BF16, device=dev)

    def run(self) -> None:
        x = self.x
        for layer, (w_qkv, w_o, w_gu, w_down) in enumerate(self.weights):
            kc, vc = self.caches[layer % len(self.caches)]
            q = (x @ w_qkv.t())[:, : H * D].reshape(-1, H, D)
            tops.paged_attention_decode(q, kc, vc, self.tables, self.seq_lens, 0.088,
                                        plan=self.plan, workspace=self.workspace,
                                        out=self.attn)  # fmt: skip
            x = self.attn.reshape(-1, H * D) @ w_o.t()
            gate, up = (x @ w_gu.t()).chunk(2, dim=-1)
            x = (F.silu(gate) * up) @ w_down.t()
        self.x.copy_(x)  # the next replay starts from this step's output, like the next layer


def in_turn(chains: list[Chain]) -> None:
    for chain in chains:
        chain.run()


def two_streams(chains: list[Chain], streams: list[torch.cuda.Stream]) -> None:
    """The chains on streams of their own, forked from and joined to the capturing stream."""
    main = torch.cuda.current_stream()
    for chain, stream in zip(chains, streams):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            chain.run()
    for stream in streams:
        main.wait_stream(stream)


# name -> (halves, two streams, attention programs per SM, chunks a KV head left out); names
# have no commas, --variants being comma-separated
VARIANTS = {
    "one stream": (False, False, 4, 0),
    "one stream 3/SM": (False, False, 3, 0),
    "one stream spare 1": (False, False, 4, 1),
    "halves in turn": (True, False, 4, 0),
    "two streams 4/SM": (True, True, 4, 0),
    "two streams 2/SM": (True, True, 2, 0),
}
assert not any("," in name for name in VARIANTS)


def time_step(names, weights, caches, lens: list[int], nb: int, dev):
    """Each named variant's graph replay time (ms) on one step of ``lens``, and its hidden
    states."""
    n, half = len(lens), len(lens) // 2
    tables = page_tables(lens, torch.randperm(nb, device=dev), dev)
    x0 = torch.randn(n, HIDDEN, dtype=BF16, device=dev)
    side = functools.partial(two_streams, streams=[torch.cuda.Stream(), torch.cuda.Stream()])
    times, outputs = [], {}
    for name in names:
        halves, streams, per_sm, spare = VARIANTS[name]
        rows = [slice(0, half), slice(half, n)] if halves else [slice(0, n)]
        group = [Chain(weights, caches, lens[r], tables[r], dev, per_sm, spare) for r in rows]
        fn = functools.partial(side if streams else in_turn, group)
        for chain, r in zip(group, rows):
            chain.x.copy_(x0[r])
        fn()  # once from x0, for the check; graph_ms then compiles, captures and replays
        outputs[name] = torch.cat([c.x for c in group]).float()
        times.append(graph_ms(fn))
    return times, outputs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--every", type=int, default=128, help="time every Nth decode step")
    ap.add_argument("--caches", type=int, default=4, help="distinct layers' caches (<= 28)")
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated, one stream first (the last column's baseline) and another",
    )
    args = ap.parse_args()
    names = args.variants.split(",")
    assert len(names) > 1 and names[0] == "one stream" and set(names) <= set(VARIANTS), names
    dev = torch.device("cuda")
    torch.manual_seed(0)
    prompts, outs = workload(256)
    plens = [len(p) for p in prompts]
    nb = cache_blocks(plens, outs)
    caches = [(torch.randn(nb, PAGE, KVH, D, dtype=BF16, device=dev),
               torch.randn(nb, PAGE, KVH, D, dtype=BF16, device=dev))
              for _ in range(args.caches)]  # fmt: skip
    weights = layer_weights(dev)
    print(f"{torch.cuda.get_device_name(dev)}; {LAYERS} layers of Qwen3-0.6B's decode GEMMs and "
          f"attention per CUDA graph, {args.caches} layers' caches")  # fmt: skip
    print("| step | live | " + " | ".join(f"{n} ms" for n in names) + " | best / one stream |")
    print("|---:|---:|" + "---:|" * (len(names) + 1))
    totals = dict.fromkeys(names, 0.0)
    wrong = []
    for t in range(0, max(outs), args.every):
        lens = [p + t + 1 for p, o in zip(plens, outs) if o > t]
        if len(lens) < 2:
            break
        times, outputs = time_step(names, weights, caches, lens, nb, dev)
        ref = outputs["one stream"]
        for name, got in outputs.items():  # other row counts or plans: other rounding only
            err = ((got - ref).norm() / ref.norm()).item()
            if err >= 0.1:  # reported at the end, so that the other rows are still timed
                wrong.append(f"step {t}, {name}: relative error {err:.1e} against one stream")
        for name, ms in zip(names, times):
            totals[name] += ms * args.every / 1e3
        print(f"| {t} | {len(lens)} | " + " | ".join(f"{ms:.2f}" for ms in times)
              + f" | {min(times[1:]) / times[0]:.2f} |", flush=True)  # fmt: skip
    print("\nrun estimate (each sampled step standing for --every steps): "
          + "; ".join(f"{k} {v:.2f} s" for k, v in totals.items()))  # fmt: skip
    if wrong:
        sys.exit("wrong hidden states:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
