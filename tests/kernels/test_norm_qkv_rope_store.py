"""The residual add + RMSNorm, qkv projection, q/k norm, rotary embedding and KV store in one
kernel, against the reference's composition of the separate ops."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close
from tests.kernels.test_rotary import cos_sin_cache

PAGE = 16

# (rows, heads, kv_heads, head_dim, hidden, (block_m, block_k)): one batch tile and several,
# rows not a multiple of it, hidden not a multiple of the K block, grouped and one-to-one heads.
CASES = [
    (1, 4, 2, 32, 64, None),
    (5, 2, 1, 64, 96, None),
    (37, 4, 4, 32, 128, (16, 64)),
    (20, 6, 2, 32, 80, (16, 32)),
] + ([(256, 16, 8, 128, 1024, None), (48, 14, 2, 64, 896, None)] if ON_GPU else [])


def _inputs(rows, heads, kv_heads, head_dim, hidden, dtype, device, *, bias, norm, padded):
    n = (heads + 2 * kv_heads) * head_dim
    h = torch.randn(rows, hidden, dtype=dtype, device=device)
    residual = torch.randn(rows, hidden, dtype=dtype, device=device)
    norm_w = torch.rand(hidden, dtype=dtype, device=device) + 0.5
    w = torch.randn(n, hidden, dtype=dtype, device=device) / hidden**0.5
    b = torch.randn(n, dtype=dtype, device=device) if bias else None
    qk_norms = tuple(
        torch.rand(head_dim, dtype=dtype, device=device) + 0.5 if norm else None for _ in "qk"
    )
    positions = torch.randint(0, 4096, (rows,), device=device)
    num_blocks = -(-rows // PAGE) + 2
    slots = torch.randperm(num_blocks * PAGE, device=device)[:rows]
    if padded:  # every third row is padding (slot -1): it writes no cache entry
        slots[::3] = -1
    shape = (num_blocks, PAGE, kv_heads, head_dim)
    caches = (torch.randn(shape, dtype=dtype, device=device) for _ in "kv")
    return h, residual, norm_w, w, b, qk_norms, positions, slots, *caches


def _config(launch: tuple[int, int] | None, head_dim: int):
    from engine_kernels.norm_linear import NormLinearConfig

    return None if launch is None else NormLinearConfig(head_dim // 2, *launch, num_warps=4)


def _both(tops, dtype, device, rows, heads, kv_heads, head_dim, hidden, *, with_residual=True,
          launch=None, bias=False, norm=True, padded=False):  # fmt: skip
    """(the kernel's query, stream, k and v caches; the reference's)."""
    h, residual, norm_w, w, b, qk_norms, pos, slots, k_cache, v_cache = _inputs(
        rows, heads, kv_heads, head_dim, hidden, dtype, device,
        bias=bias, norm=norm, padded=padded,
    )  # fmt: skip
    residual = residual if with_residual else None
    cache = cos_sin_cache(4096, head_dim, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref, sum_ref = reference.add_rms_norm_qkv_rope_store(
        h, residual, norm_w, 1e-6, w, b, pos, cache, k_ref, v_ref, slots, heads, kv_heads,
        *qk_norms, 1e-5,
    )  # fmt: skip
    q, summed = tops.add_rms_norm_qkv_rope_store(
        h, residual, norm_w, 1e-6, w, b, pos, cache, k_cache, v_cache, slots, heads, kv_heads,
        *qk_norms, 1e-5, config=_config(launch, head_dim),
    )  # fmt: skip
    return (q, summed, k_cache, v_cache), (q_ref, sum_ref, k_ref, v_ref)


@pytest.mark.parametrize("padded", [False, True], ids=["all_slots", "padding"])
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize(("rows", "heads", "kv_heads", "head_dim", "hidden", "launch"), CASES)
def test_equals_the_separate_ops(
    tops, dtype, device, rows, heads, kv_heads, head_dim, hidden, launch, bias, norm, padded
):
    got, ref = _both(
        tops, dtype, device, rows, heads, kv_heads, head_dim, hidden,
        launch=launch, bias=bias, norm=norm, padded=padded,
    )  # fmt: skip
    q, summed, k_cache, v_cache = got
    q_ref, sum_ref, k_ref, v_ref = ref
    assert q.shape == (rows, heads, head_dim) and q.is_contiguous()
    # The stream is rounded as the reference rounds it, whole rows written.
    assert torch.equal(summed, sum_ref)
    assert_close(q, q_ref, dtype)
    # Every cache entry, the untouched ones (padding rows, other slots) included.
    assert_close(k_cache, k_ref, dtype)
    assert_close(v_cache, v_ref, dtype)


def test_without_a_residual_the_stream_is_the_input(tops, dtype, device):
    (q, summed, k_cache, _), (q_ref, _, k_ref, _) = _both(
        tops, dtype, device, 7, 4, 2, 32, 96, with_residual=False, launch=(16, 32)
    )
    assert_close(q, q_ref, dtype)
    assert_close(k_cache, k_ref, dtype)


def test_the_q_norm_and_the_k_norm_are_not_swapped(tops, device):
    """With different q and k norm weights a kernel that applied one head's weight to the other
    differs from the reference (the equality tests draw both at random, but in a narrow
    range: here they are far apart)."""
    h, residual, norm_w, w, b, _, pos, slots, k_cache, v_cache = _inputs(
        6, 2, 2, 32, 64, torch.float32, device, bias=False, norm=False, padded=False
    )
    qk_norms = (torch.full((32,), 3.0, device=device), torch.full((32,), 0.25, device=device))
    cache = cos_sin_cache(4096, 32, device)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q_ref, _ = reference.add_rms_norm_qkv_rope_store(
        h, residual, norm_w, 1e-6, w, b, pos, cache, k_ref, v_ref, slots, 2, 2, *qk_norms
    )
    q, _ = tops.add_rms_norm_qkv_rope_store(
        h, residual, norm_w, 1e-6, w, b, pos, cache, k_cache, v_cache, slots, 2, 2, *qk_norms
    )
    assert_close(q, q_ref, torch.float32)
    assert_close(k_cache, k_ref, torch.float32)


def test_more_rows_than_max_take_the_separate_kernels(tops, dtype, device, monkeypatch):
    from engine_kernels import norm_qkv_rope_store

    monkeypatch.setattr(norm_qkv_rope_store, "MAX_ROWS", 4)
    launches = []
    kernel = norm_qkv_rope_store._norm_qkv_rope_store_kernel
    monkeypatch.setattr(
        norm_qkv_rope_store,
        "_norm_qkv_rope_store_kernel",
        type("Counted", (), {"__getitem__": lambda _, g: launches.append(g) or kernel[g]})(),
    )
    (q, summed, k_cache, _), (q_ref, sum_ref, k_ref, _) = _both(
        tops, dtype, device, 6, 2, 1, 32, 64
    )
    assert not launches
    assert torch.equal(summed, sum_ref)
    assert_close(q, q_ref, dtype)
    assert_close(k_cache, k_ref, dtype)
    _both(tops, dtype, device, 4, 2, 1, 32, 64)
    assert len(launches) == 1


@pytest.mark.skipif(ON_GPU, reason="on CUDA the engine takes the kernel itself (gpu_check)")
# tiny-qwen2: a qkv bias; tiny-qwen3: the q/k norm
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_the_engine_through_the_kernel_gives_the_same_greedy_tokens(tops, monkeypatch, name):
    """``ENGINE_KERNELS_NORM_LINEAR=rope``: each decode step's attention input through the
    kernel (interpreted here): the greedy tokens of the layers of before, and their top
    logprobs within fp32 rounding (a wrong q/k norm eps or position keeps most tokens)."""
    from engine_kernels import ops
    from fixtures import load_prompts, model_path
    from reference_engine import LLM, SamplingParams

    prompts = load_prompts("short")[:3]
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=6, logprobs=3)

    def outputs() -> list[tuple[list[int], list[float]]]:
        llm = LLM(str(model_path(name)), num_kv_blocks=32, max_num_seqs=4)
        return [
            (c.token_ids, [lp.logprob for step in c.logprobs for lp in step.values()])
            for c in (o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False))
        ]

    expected = outputs()
    calls = []

    def through_the_kernel(*args, **kwargs):
        calls.append(args[0].shape[0])
        return tops.add_rms_norm_qkv_rope_store(*args, **kwargs)

    monkeypatch.setattr(ops, "add_rms_norm_qkv_rope_store", through_the_kernel)
    monkeypatch.setenv("ENGINE_KERNELS_NORM_LINEAR", "rope")
    got = outputs()
    assert [t for t, _ in got] == [t for t, _ in expected]
    for (_, lps), (_, ref) in zip(got, expected):
        assert lps == pytest.approx(ref, abs=1e-4)
    assert calls, "no decode step took the kernel"
