"""The engine's CUDA path against its CPU path and HF transformers on the GPU, in one run.

    python -m benchmarks.gpu_check

For every fixture model: greedy outputs on CUDA in fp32 (Triton kernels, CUDA graphs) must equal
the CPU path's token for token; in bf16 they are compared with HF transformers' bf16 on the GPU,
identical up to near-ties (at the first difference each side's token is in the other's top-2), the
rule vLLM's own tests use. Exits non-zero on any real mismatch.

To tell bf16 rounding from a bug, both bf16 runs are also compared, by the same rule, with HF's
fp32 run on the GPU: if HF's own bf16 departs from its fp32 about as often as the engine's bf16
does, the engine's bf16 differences are rounding.
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from fixtures import ALL_MODELS, load_prompts, model_path
from reference_engine import LLM, SamplingParams

N = 32


def prompts() -> list[str]:
    return load_prompts("short")[:8] + load_prompts("long")[:2] + load_prompts("shared_prefix")[:4]


def engine_outputs(name: str, device: str, dtype: str):
    llm = LLM(
        str(model_path(name)),
        device=device,
        dtype=dtype,
        num_kv_blocks=512,
        max_num_batched_tokens=256,
        max_num_seqs=16,
    )
    params = SamplingParams(temperature=0, max_tokens=N, min_tokens=N, logprobs=2)
    outs = llm.generate(prompts(), params, use_tqdm=False)
    stats = llm.get_kv_cache_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    return outs


def hf_outputs(
    name: str, prompt_ids: list[list[int]], dtype: torch.dtype = torch.bfloat16, device="cuda"
):
    model = AutoModelForCausalLM.from_pretrained(model_path(name), dtype=dtype).to(device)
    results = []
    for ids in prompt_ids:
        x = torch.tensor([ids], device=device)
        with torch.inference_mode():
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=N,
                min_new_tokens=N,
                do_sample=False,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        tokens = out.sequences[0, len(ids) :].tolist()
        logprobs = [torch.log_softmax(s[0].float(), -1) for s in out.scores]
        results.append((tokens, logprobs))
    return results


def near_tie(ours, theirs_tokens, theirs_logprobs) -> str:
    """vLLM's rule (``check_logprobs_close``): at the first difference, each side's token must be
    among the other side's top-2 logprobs."""
    toks = ours.outputs[0].token_ids
    if toks == theirs_tokens:
        return "equal"
    i = next(j for j, (a, b) in enumerate(zip(toks, theirs_tokens)) if a != b)
    hf_top2 = theirs_logprobs[i].topk(2).indices.tolist()
    ours_top = ours.outputs[0].logprobs[i]
    if theirs_tokens[i] in ours_top and toks[i] in hf_top2:
        gap = float(theirs_logprobs[i][theirs_tokens[i]] - theirs_logprobs[i][toks[i]])
        return f"near-tie@{i}(gap {gap:.2f})"
    return f"MISMATCH@{i}{_rank(theirs_logprobs[i], theirs_tokens[i], toks[i])}"


def _rank(ref_logprobs: torch.Tensor, ref_token: int, token: int) -> str:
    """Where ``token`` ranks in the reference's distribution, and its logprob gap to the
    reference's pick: a rank of 3 and a gap of 0.1 is rounding, a rank of 50 is not."""
    rank = int((ref_logprobs > ref_logprobs[token]).sum()) + 1
    return f"(rank {rank}, gap {float(ref_logprobs[ref_token] - ref_logprobs[token]):.2f})"


def near_tie_hf(tokens, logprobs, ref_tokens, ref_logprobs) -> str:
    """The same rule between two HF runs (top-2 from each side's full logprobs)."""
    if tokens == ref_tokens:
        return "equal"
    i = next(j for j, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b)
    if ref_tokens[i] in logprobs[i].topk(2).indices.tolist() and tokens[i] in (
        ref_logprobs[i].topk(2).indices.tolist()
    ):
        gap = float(ref_logprobs[i][ref_tokens[i]] - ref_logprobs[i][tokens[i]])
        return f"near-tie@{i}(gap {gap:.2f})"
    return f"MISMATCH@{i}{_rank(ref_logprobs[i], ref_tokens[i], tokens[i])}"


def summary(verdicts: list[str]) -> str:
    bad = [v for v in verdicts if v.startswith("MISMATCH")]
    ties = sum(v.startswith("near-tie") for v in verdicts)
    return f"{verdicts.count('equal')} equal, {ties} near-tie, {len(bad)} mismatch {bad}"


def main() -> int:
    failures = 0
    print("| model | CUDA fp32 == CPU fp32 | CUDA bf16 vs HF bf16 (GPU) | HF bf16 vs HF fp32 | "
          "CUDA bf16 vs HF fp32 |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name in ALL_MODELS:
        cpu = engine_outputs(name, "cpu", "float32")
        gpu32 = engine_outputs(name, "cuda", "float32")
        same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(cpu, gpu32))
        gpu16 = engine_outputs(name, "cuda", "bfloat16")
        ids = [o.prompt_token_ids for o in gpu16]
        hf = hf_outputs(name, ids)
        hf32 = hf_outputs(name, ids, torch.float32)
        verdicts = [near_tie(o, t, lp) for o, (t, lp) in zip(gpu16, hf)]
        hf_vs_32 = [near_tie_hf(t, lp, t32, lp32) for (t, lp), (t32, lp32) in zip(hf, hf32)]
        ours_vs_32 = [near_tie(o, t32, lp32) for o, (t32, lp32) in zip(gpu16, hf32)]
        bad = [v for v in verdicts if v.startswith("MISMATCH")]
        failures += (same != len(cpu)) + len(bad)
        print(f"| {name} | {same}/{len(cpu)} | {summary(verdicts)} | {summary(hf_vs_32)} | "
              f"{summary(ours_vs_32)} |", flush=True)  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
