"""The residual add + RMSNorm inside the projection after it, against the reference's separate
norm, product and SiLU-and-mul."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close

# (rows, N, K, config): one tile and several in each direction, rows and N not multiples of
# their tiles, K not a multiple of its block (a masked last slice), a single row.
CASES = [
    (1, 64, 128, None),
    (5, 96, 160, dict(block_n=32, block_m=16, block_k=64)),
    (37, 80, 256, dict(block_n=32, block_m=16, block_k=32)),
    (20, 48, 200, dict(block_n=16, block_m=16, block_k=64)),
] + (
    [
        (256, 4096, 1024, None),
        (200, 3072, 1024, dict(block_n=64, block_m=64, num_warps=8)),
        (8, 2048, 1024, None),
    ]
    if ON_GPU
    else []
)


def _config(cfg: dict | None):
    from engine_kernels.norm_linear import NormLinearConfig

    return None if cfg is None else NormLinearConfig(**cfg)


def _inputs(rows, n, k, dtype, device, silu_gate=False, bias=False):
    h = torch.randn(rows, k, dtype=dtype, device=device)
    residual = torch.randn(rows, k, dtype=dtype, device=device)
    norm_w = torch.rand(k, dtype=dtype, device=device) + 0.5
    out_rows = 2 * n if silu_gate else n
    w = torch.randn(out_rows, k, dtype=dtype, device=device) / k**0.5
    b = torch.randn(out_rows, dtype=dtype, device=device) if bias else None
    return h, residual, norm_w, w, b


@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("silu_gate", [False, True], ids=["plain", "silu_gate"])
@pytest.mark.parametrize(("rows", "n", "k", "cfg"), CASES)
def test_equals_the_separate_norm_and_product(
    tops, dtype, device, rows, n, k, cfg, silu_gate, bias
):
    from engine_kernels.norm_linear import norm_linear

    h, residual, norm_w, w, b = _inputs(rows, n, k, dtype, device, silu_gate, bias)
    out, summed = norm_linear(
        h, residual, norm_w, 1e-6, w, b, silu_gate=silu_gate, config=_config(cfg)
    )
    ref_out, ref_summed = reference.add_rms_norm_linear(
        h, residual, norm_w, 1e-6, w, b, silu_gate=silu_gate
    )
    # The residual stream is rounded as the reference rounds it, whole rows of it written.
    assert torch.equal(summed, ref_summed)
    assert_close(out, ref_out, dtype)


@pytest.mark.parametrize("silu_gate", [False, True], ids=["plain", "silu_gate"])
def test_without_a_residual_the_stream_is_the_input(tops, dtype, device, silu_gate):
    from engine_kernels.norm_linear import norm_linear

    h, _, norm_w, w, _ = _inputs(7, 48, 96, dtype, device, silu_gate)
    cfg = _config(dict(block_n=16, block_m=16, block_k=32))
    out, summed = norm_linear(h, None, norm_w, 1e-5, w, silu_gate=silu_gate, config=cfg)
    ref_out, _ = reference.add_rms_norm_linear(h, None, norm_w, 1e-5, w, silu_gate=silu_gate)
    assert summed is h
    assert_close(out, ref_out, dtype)


def test_fp32_products_are_not_rounded_to_tf32(tops, device):
    """The engine runs fp32 on CUDA for the CPU == CUDA check: a tf32 product (10-bit
    mantissa) would be off by about 1e-3 relative, far above fp32's tolerance."""
    from engine_kernels.norm_linear import norm_linear

    h, residual, norm_w, w, _ = _inputs(12, 64, 512, torch.float32, device)
    out, _ = norm_linear(h, residual, norm_w, 1e-6, w)
    x = h.double() + residual.double()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w.double()
    assert_close(out, (normed @ w.double().t()).float(), torch.float32)


def test_more_rows_than_max_take_the_separate_kernels(tops, dtype, device, monkeypatch):
    from engine_kernels import norm_linear

    monkeypatch.setattr(norm_linear, "MAX_ROWS", 4)
    calls = []
    real = norm_linear.norm_linear
    monkeypatch.setattr(
        norm_linear, "norm_linear", lambda *a, **kw: calls.append(1) or real(*a, **kw)
    )
    h, residual, norm_w, w, _ = _inputs(6, 32, 64, dtype, device, silu_gate=True)
    out, summed = norm_linear.add_rms_norm_linear(h, residual, norm_w, 1e-6, w, silu_gate=True)
    ref_out, ref_summed = reference.add_rms_norm_linear(
        h, residual, norm_w, 1e-6, w, silu_gate=True
    )
    assert not calls
    assert torch.equal(summed, ref_summed)
    assert_close(out, ref_out, dtype)
    norm_linear.add_rms_norm_linear(h[:4], residual[:4], norm_w, 1e-6, w, silu_gate=True)
    assert calls == [1]


@pytest.mark.skipif(ON_GPU, reason="on CUDA the engine takes the kernel itself (gpu_check)")
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])  # tiny-qwen2: a qkv bias
def test_the_engine_through_the_kernel_gives_the_same_greedy_tokens(tops, monkeypatch, name):
    """The decoder layers with the norms inside the projections (opt-in), each of their two
    norm + projection ops through the kernel (interpreted here, at every row count, prefill
    chunks included): the greedy tokens of the layers with the split-K o and down ops."""
    from engine_kernels import norm_linear, ops
    from fixtures import load_prompts, model_path
    from reference_engine import LLM, SamplingParams

    prompts = load_prompts("short")[:3]
    params = SamplingParams(temperature=0, max_tokens=6, min_tokens=6)

    def tokens() -> list[list[int]]:
        llm = LLM(str(model_path(name)), num_kv_blocks=32, max_num_seqs=4)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    expected = tokens()
    calls = []

    def through_the_kernel(*args, **kwargs):
        calls.append(kwargs.get("silu_gate", False))
        return norm_linear.norm_linear(*args, **kwargs)

    monkeypatch.setattr(ops, "add_rms_norm_linear", through_the_kernel)
    monkeypatch.setenv("ENGINE_KERNELS_NORM_LINEAR", "1")
    assert tokens() == expected
    assert True in calls and False in calls
