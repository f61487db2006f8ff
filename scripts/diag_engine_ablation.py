"""What one kind of kernel costs inside the engine, end to end: the throughput benchmark's `LLM`
run (benchmarks/gpu_throughput.py) with that kernel left out, against the same run with it.

The workload ignores EOS, so the schedule (steps, batches, lengths) does not depend on the
tokens: leaving a kernel out changes the outputs but not the work around it, and the difference
in wall time is what the kernel costs there, overlap and graph launch included. Unlike the torch
profiler, nothing is traced. Each ablation runs in a fresh process, after the benchmark's
untimed warm-up pass.

    python scripts/diag_engine_ablation.py none decode_attention prefill_attention
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ABLATIONS = {
    "none": "nothing left out",
    "decode_attention": "the decode attention (its output is its query)",
    "prefill_attention": "the prefill attention (its output is its query)",
    "linear": "every projection, prefill and decode (an empty output; the o and down ones keep the"
    " residual add and norm they are fused with)",
    "lm_head": "the LM head (empty logits)",
    "none_cublas": "nothing, with the o and down projections in cuBLAS at every row count",
    "norms_silu": "the add + RMSNorm and SiLU-and-mul kernels around the o and down projections"
    " (their input passed on; the projections in cuBLAS): the most that fusing them into the"
    " projections could save, against none_cublas",
}


def _skip(name: str) -> None:
    from engine_kernels import ops

    def identity(q, *args, **kwargs):
        return q

    if name == "decode_attention":
        ops.paged_attention_decode = identity
    elif name == "prefill_attention":
        ops.paged_attention_prefill = identity
    elif name == "linear":
        import torch

        def empty_linear(self, x):
            return x.new_empty(*x.shape[:-1], self.out_features)

        fused_add_rms_norm = ops.fused_add_rms_norm

        def add_and_norm_only(x, weight, residual, norm_weight, eps, **kwargs):
            return fused_add_rms_norm(torch.empty_like(residual), residual, norm_weight, eps)

        torch.nn.Linear.forward = empty_linear
        ops.projection_add_rms_norm = add_and_norm_only
    elif name in ("none_cublas", "norms_silu"):
        from engine_kernels import linear_split_k

        linear_split_k.MAX_ROWS = 0
        if name == "norms_silu":
            linear_split_k.silu_and_mul = lambda x: x[..., : x.shape[-1] // 2]
            linear_split_k.fused_add_rms_norm = lambda x, residual, weight, eps: (x, residual)
    elif name == "lm_head":
        from reference_engine.models.llama import CausalLM

        def empty_logits(self, hidden):
            return hidden.new_empty(hidden.shape[0], self.config.vocab_size)

        CausalLM.compute_logits = empty_logits


def run_one(name: str) -> None:
    from benchmarks.gpu_throughput import ENGINE_ARGS, QWEN3_0_6B, run_llm, workload

    _skip(name)
    prompts, outs = workload(256)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(QWEN3_0_6B))
        seconds, tokens = run_llm(folder, prompts, outs, dict(ENGINE_ARGS))
    print(json.dumps({"ablation": name, "seconds": seconds, "tokens": tokens}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ablations", nargs="+", choices=list(ABLATIONS))
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        run_one(args.ablations[0])
        return
    results = {}
    for name in args.ablations:
        proc = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True,
                              text=True)  # fmt: skip
        line = next((x for x in proc.stdout.splitlines() if x.startswith("{")), None)
        if proc.returncode or line is None:
            print(f"{name}: failed ({proc.returncode})\n{proc.stderr[-2000:]}", flush=True)
            continue
        results[name] = json.loads(line)["seconds"]
        print(f"{name} ({ABLATIONS[name]}): {results[name]:.2f} s", flush=True)
    if "none" in results:
        print("\n| left out | seconds | its cost in the engine |\n|---|---:|---:|")
        for name, s in results.items():
            print(f"| {ABLATIONS[name]} | {s:.2f} | {results['none'] - s:+.2f} s |")


if __name__ == "__main__":
    main()
