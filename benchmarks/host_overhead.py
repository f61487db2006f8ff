"""The engine's host bookkeeping per generated token, with a model that costs next to nothing.

    python -m benchmarks.host_overhead                      # median us per generated token
    python -m benchmarks.host_overhead --profile 25         # and a cProfile's top 25 (cumulative)
    python -m benchmarks.host_overhead --async-scheduling   # decode steps chained, as on CUDA

A 1-layer model of hidden size 32 (the tiny-llama fixture's vocabulary and tokenizer, seeded
dummy weights) on one torch thread: what remains of each step is the scheduler, the runner's
input layout, the token appends, stop checks, detokenization and outputs. Greedy with
``ignore_eos`` and a fixed random workload, so every run generates the same tokens.

The model's own time (its forward, paged attention included, and the logits) is timed apart
and reported beside the rest, the host's bookkeeping: on a shared machine that figure is the
steadier one, as the attention's time varies most from run to run.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "fixtures" / "models" / "tiny-llama"


def write_model(folder: Path) -> None:
    base = json.loads((TOKENIZER / "config.json").read_text())
    config = {**base, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))


def time_model(model: torch.nn.Module) -> list[float]:
    """Adds the seconds spent in ``model``'s forward and logits to the returned cell."""
    spent = [0.0]

    def timed(fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return call

    model.forward = timed(model.forward)
    model.compute_logits = timed(model.compute_logits)
    return spent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 128))
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5, help="report the median round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--async-scheduling", action="store_true", help="chained decode steps, as on CUDA"
    )
    ap.add_argument("--profile", type=int, metavar="N", help="profile one more round, print top N")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    from reference_engine import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        write_model(Path(tmp))
        llm = LLM(tmp, tokenizer=str(TOKENIZER), load_format="dummy", device="cpu",
                  async_scheduling=args.async_scheduling)  # fmt: skip
    rng = random.Random(args.seed)
    vocab = llm.llm_engine.model_config.vocab_size
    model_seconds = time_model(llm.llm_engine.model_runner.model)

    def run() -> int:
        # A fresh workload each round: no prefix-cache hit from an earlier round.
        prompts = [
            {"prompt_token_ids": [rng.randrange(10, vocab - 10)
                                  for _ in range(rng.randint(*args.prompt_len))]}
            for _ in range(args.num_prompts)
        ]  # fmt: skip
        params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    run()  # warm-up
    total, host = [], []  # us per generated token, each round
    for _ in range(args.rounds):
        model_seconds[0] = 0.0
        start = time.perf_counter()
        tokens = run()
        seconds = time.perf_counter() - start
        total.append(seconds / tokens * 1e6)
        host.append((seconds - model_seconds[0]) / tokens * 1e6)
    print(
        f"{args.num_prompts} prompts x {args.output_len} tokens, torch {torch.__version__}, "
        f"1 thread, us per generated token, median (min) of {args.rounds} rounds: "
        f"host {statistics.median(host):.2f} ({min(host):.2f}), "
        f"total {statistics.median(total):.2f} ({min(total):.2f})"
    )
    print("rounds, host/total: " + " ".join(f"{h:.2f}/{t:.2f}" for h, t in zip(host, total)))
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
