"""Offline throughput on a fixed random workload, side by side with peers in one run.

    python -m benchmarks.throughput --model fixtures/models/tiny-llama --engines reference,async,hf
    python -m benchmarks.throughput --engines reference,vllm   # vLLM from --vllm-python

Each engine runs the same prompts (random token ids, fixed seed) with greedy sampling and
``ignore_eos``, so every engine produces exactly the same number of output tokens. Prints output
tok/s per engine and the ratio to the first one; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks import model_shapes

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = str(ROOT / "fixtures" / "models" / "tiny-llama")


@dataclass
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


@dataclass
class Result:
    engine: str
    seconds: float
    output_tokens: int
    note: str = ""
    cpu_seconds: float = 0.0  # CPU time of the engine's processes during the measured run

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds


def cpu_seconds() -> float:
    """CPU time (user + system) so far of this process and its live child processes (vLLM's
    engine core runs in one): on a shared machine a steadier measure of work than wall time."""
    try:
        import psutil
    except ImportError:
        return time.process_time()
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # it may have exited meanwhile
            total += sum(child.cpu_times()[:2])
    return total


def make_workload(
    n: int,
    prompt_len: tuple[int, int],
    output_len: tuple[int, int],
    vocab: int,
    seed: int,
    prompt_set: list[list[int]] | None = None,
) -> Workload:
    rng = random.Random(seed)
    if prompt_set:  # a fixture prompt set, cycled (rotated by the seed) to n prompts
        prompts = [prompt_set[(i + seed) % len(prompt_set)] for i in range(n)]
        return Workload(prompts, [rng.randint(*output_len) for _ in range(n)])
    # Ids 10..vocab-10 keep clear of special tokens at either end of the fixture vocabularies.
    prompts = [
        [rng.randrange(10, vocab - 10) for _ in range(rng.randint(*prompt_len))] for _ in range(n)
    ]
    return Workload(prompts, [rng.randint(*output_len) for _ in range(n)])


NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}  # fmt: skip


def run_ngram(model: str, w: Workload, warm: Workload, engine_args: dict) -> Result:
    result = run_reference(model, w, warm, {**engine_args, "speculative_config": NGRAM})
    result.engine = "reference LLM + n-gram speculation (k=4)"
    return result


def run_reference(model: str, w: Workload, warm: Workload, engine_args: dict) -> Result:
    from reference_engine import LLM, SamplingParams

    llm = LLM(model, **engine_args)

    def generate(load: Workload, use_tqdm: bool) -> list:
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
                  for m in load.output_lens]  # fmt: skip
        prompts = [{"prompt_token_ids": p} for p in load.prompts]
        return llm.generate(prompts, params, use_tqdm=use_tqdm)

    generate(warm, use_tqdm=False)
    before = llm.get_stats()
    cpu, start = cpu_seconds(), time.perf_counter()
    outs = generate(w, use_tqdm=True)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    after = llm.get_stats()
    note = f"{after.num_steps - before.num_steps} steps"
    drafted = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    if drafted:
        accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
        note += f", {accepted}/{drafted} drafted tokens accepted ({accepted / drafted:.0%})"
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return Result("reference LLM", seconds, tokens, note, cpu)


def run_reference_async(model: str, w: Workload, warm: Workload, engine_args: dict) -> Result:
    from reference_engine import AsyncEngineArgs, AsyncLLM, RequestOutputKind, SamplingParams

    async def main() -> Result:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_args))

        async def one(rid: str, prompt: list[int], max_tokens: int) -> int:
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True,
                                    output_kind=RequestOutputKind.FINAL_ONLY)  # fmt: skip
            stream = engine.generate({"prompt_token_ids": prompt}, params, rid)
            outs = [out async for out in stream]
            return len(outs[-1].outputs[0].token_ids)

        async def run(load: Workload, tag: str) -> list[int]:
            return await asyncio.gather(
                *(
                    one(f"{tag}{i}", p, m)
                    for i, (p, m) in enumerate(zip(load.prompts, load.output_lens))
                )
            )

        await run(warm, "warm")
        cpu, start = cpu_seconds(), time.perf_counter()
        counts = await run(w, "r")
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
        engine.shutdown()
        return Result("reference AsyncLLM", seconds, sum(counts), cpu_seconds=cpu)

    return asyncio.run(main())


def run_hf(model: str, w: Workload, warm: Workload, engine_args: dict) -> Result:
    """HF ``generate`` in static, length-sorted, left-padded batches (its plain batch path)."""
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()

    def generate(load: Workload, batch_size: int = 64) -> int:
        order = sorted(range(len(load.prompts)), key=lambda i: len(load.prompts[i]))
        total = 0
        for lo in range(0, len(order), batch_size):
            idx = order[lo : lo + batch_size]
            width = max(len(load.prompts[i]) for i in idx)
            ids = torch.zeros(len(idx), width, dtype=torch.long)
            mask = torch.zeros(len(idx), width, dtype=torch.long)
            for row, i in enumerate(idx):
                p = load.prompts[i]
                ids[row, width - len(p) :] = torch.tensor(p)
                mask[row, width - len(p) :] = 1
            new = max(load.output_lens[i] for i in idx)
            with torch.inference_mode():
                hf.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                            max_new_tokens=new, min_new_tokens=new, do_sample=False,
                            pad_token_id=0)  # fmt: skip
            # Only the tokens each request asked for count: padding work is HF's cost.
            total += sum(load.output_lens[i] for i in idx)
        return total

    generate(warm)
    cpu, start = cpu_seconds(), time.perf_counter()
    total = generate(w)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    return Result("HF transformers generate", seconds, total, cpu_seconds=cpu)


def run_vllm(model: str, w: Workload, warm: Workload, engine_args: dict) -> Result:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; DESIGN.md's setting here
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_num_seqs=256)

    def generate(load: Workload, use_tqdm: bool) -> list:
        params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True)
                  for m in load.output_lens]  # fmt: skip
        prompts = [{"prompt_token_ids": p} for p in load.prompts]
        return llm.generate(prompts, params, use_tqdm=use_tqdm)

    generate(warm, use_tqdm=False)
    cpu, start = cpu_seconds(), time.perf_counter()
    outs = generate(w, use_tqdm=True)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    return Result("vLLM-CPU LLM", seconds, tokens, cpu_seconds=cpu)


RUNNERS: dict[str, Callable[[str, Workload, Workload, dict], Result]] = {
    "reference": run_reference,
    "ngram": run_ngram,
    "async": run_reference_async,
    "hf": run_hf,
    "vllm": run_vllm,
}


RESULT_PREFIX = "BENCH-RESULT "


def _run_isolated(python: str, name: str, argv: list[str]) -> Result:
    """Each measurement runs in a fresh process: engines of earlier runs (and their thread pools)
    cannot slow it down, and vLLM runs in its own environment."""
    cmd = [python, "-m", "benchmarks.throughput", *argv, "--single", name]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True)
    line = next(x for x in proc.stdout.splitlines() if x.startswith(RESULT_PREFIX))
    return Result(**json.loads(line.removeprefix(RESULT_PREFIX)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"a checkpoint, or one of {list(model_shapes.SHAPES)}",
    )
    ap.add_argument("--engines", default="reference,async,hf", help=f"from {sorted(RUNNERS)}")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--output-len", type=int, nargs=2, default=(64, 64))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--prompt-set", help="a fixture prompt set (e.g. repetitive) instead of random ids"
    )
    ap.add_argument("--rounds", type=int, default=3, help="report each engine's median round")
    ap.add_argument("--threads", type=int, help="torch CPU threads in every engine's process")
    ap.add_argument("--engine-args", default="{}", help="JSON of reference EngineArgs fields")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--vllm-python",
        default=".tox/conformance-vllm/bin/python",
        help="interpreter with vllm-cpu installed, for --engines ...,vllm",
    )
    ap.add_argument("--single", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.model = model_shapes.resolve(args.model)

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    prompt_set = None
    if args.prompt_set:
        from transformers import AutoTokenizer

        from fixtures import load_prompts

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        prompt_set = [tokenizer.encode(p) for p in load_prompts(args.prompt_set)]
    sizes = (args.num_prompts, args.prompt_len, args.output_len, vocab)
    w = make_workload(*sizes, args.seed, prompt_set)
    engine_args = json.loads(args.engine_args)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.single:  # one measurement, in this fresh process, reported on stdout
        # The warm-up load differs from the measured one, so no prefix-cache hit helps the timing.
        warm = make_workload(
            args.num_prompts, args.prompt_len, args.output_len, vocab, args.seed + 1
        )
        result = RUNNERS[args.single](args.model, w, warm, engine_args)
        print(RESULT_PREFIX + json.dumps(asdict(result)))
        return 0
    names = args.engines.split(",")
    runs: dict[str, list[Result]] = {name: [] for name in names}
    for r in range(args.rounds):  # interleaved rounds: load from other processes hits all alike
        for name in names:
            print(f"== round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            python = args.vllm_python if name == "vllm" else sys.executable
            runs[name].append(_run_isolated(python, name, argv or sys.argv[1:]))
    results = [sorted(rs, key=lambda x: x.seconds)[len(rs) // 2] for rs in runs.values()]
    # The median of each engine's CPU time over its rounds, taken apart from the wall-time median.
    cpu = [sorted(r.cpu_seconds for r in rs)[len(rs) // 2] for rs in runs.values()]

    base = results[0].tok_per_s
    print(
        f"\n{len(w.prompts)} prompts, {w.num_output_tokens} output tokens, "
        f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} torch threads"
    )
    print(
        f"| engine | seconds | output tok/s | ratio to {results[0].engine} | CPU seconds "
        f"| CPU ratio | notes |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for r, c in zip(results, cpu):
        print(
            f"| {r.engine} | {r.seconds:.2f} | {r.tok_per_s:,.0f} | {r.tok_per_s / base:.2f} "
            f"| {c:.2f} | {cpu[0] / c:.2f} | {r.note} |"
        )
    print("(CPU ratio: the first engine's CPU seconds over this one's; above 1 means less work.)")
    for name, rs in runs.items():  # every round, to judge the spread on a shared machine
        rounds = " ".join(f"{r.seconds:.2f}/{r.cpu_seconds:.2f}" for r in rs)
        print(f"rounds (wall/CPU s) {name}: {rounds}", file=sys.stderr)
    if args.json:
        rows = [
            asdict(r) | {"tok_per_s": r.tok_per_s, "median_cpu_seconds": c}
            for r, c in zip(results, cpu)
        ]
        args.json.write_text(
            json.dumps(
                {"workload": vars(args) | {"json": None}, "results": rows}, indent=2, default=str
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
