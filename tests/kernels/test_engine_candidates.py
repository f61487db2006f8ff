"""The opt-in decode-step candidates inside the engine, on CUDA: each leaves the greedy tokens of
the default path unchanged (fp32, CUDA graphs, the planned decode), on a model with q/k norm
and one without.

``ENGINE_KERNELS_DECODE_FROM_QKV=1`` replaces the query's norm and rotation and the new key's
cache store with the attention kernel's own; ``ENGINE_KERNELS_ARGMAX=1`` the greedy argmax. The
requests ask for no logprobs, so their tokens come from the greedy fast path that the argmax
serves. Skipped without a GPU: the kernels' own tests run under the interpreter, and on the CPU
the engine takes the reference ops whatever the variables say.
"""

from __future__ import annotations

import gc

import pytest
import torch

from fixtures import load_prompts, model_path
from reference_engine import LLM, SamplingParams

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the planned decode in CUDA graphs needs a GPU"
)

TOKENS = 24


def _greedy_tokens(model: str) -> list[list[int]]:
    llm = LLM(
        str(model_path(model)), device="cuda", dtype="float32", num_kv_blocks=512,
        max_num_batched_tokens=256, max_num_seqs=16,
    )  # fmt: skip
    prompts = load_prompts("short")[:8] + load_prompts("long")[:2]
    params = SamplingParams(temperature=0, max_tokens=TOKENS, min_tokens=TOKENS)
    outs = llm.generate(prompts, params, use_tqdm=False)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("variable", ["ENGINE_KERNELS_DECODE_FROM_QKV", "ENGINE_KERNELS_ARGMAX"])
@pytest.mark.parametrize("model", ["tiny-qwen3", "tiny-llama"])
def test_greedy_tokens_unchanged(monkeypatch, variable, model):
    monkeypatch.setenv(variable, "0")
    default = _greedy_tokens(model)
    monkeypatch.setenv(variable, "1")
    candidate = _greedy_tokens(model)
    assert all(len(t) == TOKENS for t in default)
    assert candidate == default
