"""The offline ``LLM`` with the CPU's C++ decode attention opted in
(``ENGINE_KERNELS_CPU_DECODE=1``): outputs equal HF transformers token for token, under chunked
prefill, prefix caching and preemption, as with the PyTorch path."""

import pytest

from engine_kernels import cpu_decode
from fixtures import model_path
from reference_engine import LLM
from tests.engine.test_llm import N, assert_idle, greedy, mixed_prompts


@pytest.mark.skipif(not cpu_decode.available(), reason="the C++ kernel cannot be built here")
def test_greedy_equals_hf_with_the_cpp_decode(model_name, hf_greedy, monkeypatch):
    monkeypatch.setenv(cpu_decode.OPT_IN, "1")
    llm = LLM(
        str(model_path(model_name)),
        num_kv_blocks=40,
        block_size=16,
        max_num_batched_tokens=128,
        max_num_seqs=8,
    )
    outs = llm.generate(mixed_prompts(), greedy(), use_tqdm=False)
    for o in outs:
        assert o.outputs[0].token_ids == hf_greedy(model_name, o.prompt_token_ids, N), o.prompt
    assert llm.get_stats().num_preemptions > 0
    assert_idle(llm)
