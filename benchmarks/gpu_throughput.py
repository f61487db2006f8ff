"""End-to-end GPU throughput: the reference engine (``LLM`` and ``AsyncLLM``) against HF
transformers on a model with Qwen3-0.6B's shapes (random bf16 weights, no download).

    python -m benchmarks.gpu_throughput [--num-requests 256] [--hf-time-cap 150]

256 requests, prompt and output lengths uniform in 100..1024 (fixed seed, ``ignore_eos``).
Also measures the card's copy bandwidth and prints the workload's bandwidth floor: every decode
step must read the weights once and the live KV cache once.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}


# The engine's options for every run of this benchmark (--engine-args adds to them).
ENGINE_ARGS = {
    "skip_tokenizer_init": True,
    "load_format": "dummy",
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "max_model_len": 4096,
}


def workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(1000, 150000) for _ in range(rng.randint(100, 1024))]
               for _ in range(n)]  # fmt: skip
    return prompts, [rng.randint(100, 1024) for _ in range(n)]


def copy_bandwidth() -> float:
    """Bytes read + written per second by a device-to-device copy of 4 GiB."""
    src = torch.empty(1 << 30, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 10
    del src, dst
    torch.cuda.empty_cache()
    return 2 * (1 << 32) / seconds


def bandwidth_floor(prompts: list[list[int]], outs: list[int], bw: float) -> float:
    """Seconds to read the weights once per decode step and each live context once, with every
    request in the batch from the start (it fits the H200's memory)."""
    c = QWEN3_0_6B
    weight_bytes = 2 * (c["vocab_size"] * c["hidden_size"] + c["num_hidden_layers"] * (
        c["hidden_size"] * (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * c["head_dim"]
        + c["num_attention_heads"] * c["head_dim"] * c["hidden_size"]
        + 3 * c["hidden_size"] * c["intermediate_size"]))  # fmt: skip
    kv_per_token = 2 * 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * c["head_dim"]
    total = 0.0
    for t in range(max(outs)):
        ctx = sum(len(p) + t for p, o in zip(prompts, outs) if o > t)
        total += weight_bytes + ctx * kv_per_token
    return total / bw


def warm_up_requests(n: int = 256) -> tuple[list[list[int]], list[int]]:
    """Prompts of the workload's lengths but other tokens, with 1..32 output tokens, for one
    untimed pass before the timed one. A process's first pass compiles Triton variants, queries
    cuBLAS for the prefill shapes and allocates pinned buffers: on 2026-12-03 the first timed
    pass after a 4-request warm-up took 0.9 s longer than the next one. Other tokens, so that
    the timed pass finds nothing of them in the prefix cache."""
    prompts, _ = workload(n, seed=2)
    return prompts, [1 + (7 * i) % 32 for i in range(n)]


def _engine_counters(core) -> tuple[int, float, int]:
    """(steps, seconds the host waited for the GPU, preemptions) so far."""
    stats = core.get_stats()
    return stats.num_steps, core.model_runner.host_wait_s, stats.num_preemptions


def _print_counters(core, seconds: float, before: tuple) -> None:
    steps, waited, preempted = (a - b for a, b in zip(_engine_counters(core), before))
    # Waiting long for the GPU means the GPU sets the pace; waiting little, the host does. The
    # KV blocks show that each engine of the process had the same memory.
    print(f"  {seconds:.2f} s, {steps} steps, host waited for the GPU {waited:.2f} s, "
          f"{preempted} preemptions, {core.model_runner.num_blocks} KV blocks",
          flush=True)  # fmt: skip


def release_gpu_memory() -> None:
    """Frees what a finished engine held, reference cycles included, so that the next engine of
    the process sizes its KV cache from the same free memory (an engine kept alive by a cycle
    left the next one fewer blocks)."""
    gc.collect()
    torch.cuda.empty_cache()


def run_llm(folder: str, prompts, outs, engine_args) -> tuple[float, int]:
    from reference_engine import LLM, SamplingParams

    llm = LLM(folder, **engine_args)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    inputs = [{"prompt_token_ids": p} for p in prompts]
    warm, warm_outs = warm_up_requests()
    llm.generate(
        [{"prompt_token_ids": p} for p in warm],
        [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in warm_outs],
        use_tqdm=False,
    )
    torch.cuda.synchronize()
    before = _engine_counters(llm.llm_engine)
    start = time.perf_counter()
    results = llm.generate(inputs, params)
    seconds = time.perf_counter() - start
    _print_counters(llm.llm_engine, seconds, before)
    del llm
    release_gpu_memory()
    return seconds, sum(len(r.outputs[0].token_ids) for r in results)


def run_async(folder: str, prompts, outs, engine_args) -> tuple[float, int]:
    from reference_engine import AsyncEngineArgs, AsyncLLM, RequestOutputKind, SamplingParams

    async def main() -> tuple[float, int]:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=folder, **engine_args))

        async def one(rid: str, prompt: list[int], n: int) -> int:
            params = SamplingParams(
                temperature=0,
                max_tokens=n,
                ignore_eos=True,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            stream = engine.generate({"prompt_token_ids": prompt}, params, rid)
            return len([o async for o in stream][-1].outputs[0].token_ids)

        warm, warm_outs = warm_up_requests()
        await asyncio.gather(*(one(f"w{i}", p, o) for i, (p, o) in enumerate(zip(warm, warm_outs))))
        core = engine.engine  # read only while the engine thread idles (before and after)
        before = _engine_counters(core)
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(one(str(i), p, o) for i, (p, o) in enumerate(zip(prompts, outs)))
        )
        seconds = time.perf_counter() - start
        _print_counters(core, seconds, before)
        engine.shutdown()
        return seconds, sum(counts)

    result = asyncio.run(main())
    release_gpu_memory()
    return result


def profile(
    folder: str, engine_args: dict, num_requests: int = 128, out_len: int | None = 128
) -> None:
    """Where a decode-heavy run's time goes: Python functions (cProfile) and GPU kernels.
    ``out_len`` None: the benchmark's own output lengths (the full workload)."""
    import cProfile
    import pstats

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from reference_engine import LLM, SamplingParams

    llm = LLM(folder, **engine_args)
    prompts, outs = workload(num_requests, seed=1)
    inputs = [{"prompt_token_ids": p} for p in prompts]
    params = [SamplingParams(temperature=0, max_tokens=out_len or o, ignore_eos=True) for o in outs]
    warm, warm_outs = warm_up_requests()
    llm.generate(
        [{"prompt_token_ids": p} for p in warm],
        [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in warm_outs],
        use_tqdm=False,
    )
    prof = cProfile.Profile()
    start = time.perf_counter()
    prof.runcall(llm.generate, inputs, params, use_tqdm=False)
    wall = time.perf_counter() - start
    steps = llm.get_stats().num_steps
    print(
        f"\n== cProfile: {num_requests} requests x {out_len or 'workload'} tokens, {wall:.2f} s, "
        f"{steps} steps in all"
    )
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        start = time.perf_counter()
        llm.generate(inputs, params, use_tqdm=False)
        wall = time.perf_counter() - start
    events = tp.key_averages()
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6
    print(f"== torch profiler: GPU kernels busy {busy:.2f} s of {wall:.2f} s wall, by GPU time")
    print(events.table(sort_by="self_cuda_time_total", row_limit=25))
    del llm
    release_gpu_memory()


def run_hf(prompts, outs, batch_size: int, time_cap: float) -> tuple[float, int, int]:
    """HF ``generate`` in static, length-sorted, left-padded batches; stops after ``time_cap``
    seconds and reports the useful tokens of the batches it finished."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**{k: v for k, v in QWEN3_0_6B.items() if k != "architectures"})
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).cuda().eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]) + outs[i])
    done = useful = 0
    start = time.perf_counter()
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, i in enumerate(idx):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        new = max(outs[i] for i in idx)
        with torch.inference_mode():
            model.generate(
                input_ids=ids.cuda(),
                attention_mask=mask.cuda(),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        torch.cuda.synchronize()
        done += len(idx)
        useful += sum(outs[i] for i in idx)
        if time.perf_counter() - start > time_cap:
            break
    seconds = time.perf_counter() - start
    del model
    release_gpu_memory()
    return seconds, useful, done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument(
        "--engines",
        default="llm,async,hf",
        help="comma-separated: llm, llm-sync (no overlap), async, hf, profile, profile-full",
    )
    ap.add_argument("--hf-batch-size", type=int, default=64)
    ap.add_argument("--hf-time-cap", type=float, default=150.0)
    ap.add_argument("--engine-args", default="{}")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    prompts, outs = workload(args.num_requests)
    bw = copy_bandwidth()
    floor = bandwidth_floor(prompts, outs, bw)
    total = sum(outs)
    print(
        f"torch {torch.__version__}, {torch.cuda.get_device_name()}, copy bandwidth "
        f"{bw / 1e12:.2f} TB/s; {len(prompts)} requests, {total} output tokens; "
        f"bandwidth floor {floor:.2f} s = {total / floor:,.0f} tok/s",
        flush=True,
    )
    engine_args = {**ENGINE_ARGS, **json.loads(args.engine_args)}
    rows, reqs = {}, len(prompts)

    def add(label: str, row: tuple) -> None:  # a repeated engine gets "#2", "#3": every run shows
        runs = sum(1 for k in rows if k.split(" #")[0] == label)
        rows[label if runs == 0 else f"{label} #{runs + 1}"] = row
        print(f"{label}: {row}", flush=True)

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(QWEN3_0_6B))
        for name in args.engines.split(","):
            if name == "llm":
                add("reference LLM", (*run_llm(folder, prompts, outs, engine_args), reqs))
            elif name == "llm-sync":  # the same without overlapped (async) scheduling
                sync = {**engine_args, "async_scheduling": False}
                add("reference LLM, no overlap", (*run_llm(folder, prompts, outs, sync), reqs))
            elif name == "async":
                add("reference AsyncLLM", (*run_async(folder, prompts, outs, engine_args), reqs))
            elif name == "profile":  # a short decode-heavy run: 128 requests x 128 tokens
                profile(folder, engine_args)
            elif name == "profile-full":  # the workload's shape: --num-requests, lengths 100..1024
                profile(folder, engine_args, args.num_requests, out_len=None)
            elif name == "hf":
                add("HF transformers generate", run_hf(prompts, outs, args.hf_batch_size,
                                                       args.hf_time_cap))  # fmt: skip
    print("\n| engine | requests | output tokens | seconds | output tok/s | of floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, (s, n, reqs) in rows.items():
        print(f"| {name} | {reqs} | {n} | {s:.1f} | {n / s:,.0f} | {n / s / (total / floor):.0%} |")
    tps = {}  # engine -> output tok/s of each of its runs
    for name, (s, n, _) in rows.items():
        tps.setdefault(name.split(" #")[0], []).append(n / s)
    med = {k: statistics.median(v) for k, v in tps.items()}
    if "reference LLM" in med and "HF transformers generate" in med:
        print(f"LLM / HF: {med['reference LLM'] / med['HF transformers generate']:.1f}x")
    if "reference LLM" in med and "reference AsyncLLM" in med:
        runs = len(tps["reference LLM"]), len(tps["reference AsyncLLM"])
        how = "" if runs == (1, 1) else f" (medians of {runs[0]} and {runs[1]} runs)"
        print(f"AsyncLLM / LLM: {med['reference AsyncLLM'] / med['reference LLM']:.2f}{how}")
    if args.json:
        args.json.write_text(json.dumps({"bandwidth": bw, "floor_s": floor, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
