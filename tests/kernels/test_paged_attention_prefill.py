"""The prefill kernel's tile configurations and loop variants against the reference.

On the CPU (interpreter) small tiles exercise both loop variants, tiles larger and smaller than a
page, and query tiles larger than key tiles; on CUDA every candidate configuration the benchmark
sweeps is checked. A cache whose unused slots hold NaN catches reads of keys or values that no
row may see (0 * NaN is NaN in the P @ V product).
"""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close, paged_kv_cache


def _cfg(block_m, block_n, loop, num_warps=4, num_stages=1):
    return {"block_m": block_m, "block_n": block_n, "num_warps": num_warps,
            "num_stages": num_stages, "loop": loop}  # fmt: skip


def _configs(head_dim: int) -> list[dict]:
    if ON_GPU:
        from engine_kernels.paged_attention_prefill import CANDIDATE_CONFIGS

        return CANDIDATE_CONFIGS[64 if head_dim <= 64 else 128]
    return [_cfg(16, 16, 0), _cfg(16, 16, 1), _cfg(32, 16, 0), _cfg(16, 32, 1), _cfg(32, 8, 0)]


def _cfg_id(cfg: dict) -> str:
    return "m{block_m}n{block_n}w{num_warps}s{num_stages}l{loop}".format(**cfg)


# (cached prefix, new tokens): chunked prefill on and off page / tile boundaries, a single token,
# an empty run, a speculative-verification-like extend.
CASES = [(0, 1), (0, 47), (5, 0), (16, 16), (31, 5), (3, 30), (64, 65), (100, 5)]
if ON_GPU:
    CASES += [(0, 700), (333, 259), (1025, 3)]


def _inputs(cases, heads, kv_heads, head_dim, block_size, dtype, device, nan_unused=False):
    q_lens = [q for _, q in cases]
    seq_lens = [c + q for c, q in cases]
    k_cache, v_cache, tables = paged_kv_cache(
        seq_lens, kv_heads, head_dim, block_size, dtype, device
    )
    if nan_unused:
        # Every slot outside the sequences' contexts (the rest of each last page, the spare
        # blocks) holds NaN, and table entries past a context point at a spare block.
        used = torch.zeros(k_cache.shape[:2], dtype=torch.bool, device=device)
        spare = set(range(k_cache.shape[0]))
        for b, n in enumerate(seq_lens):
            pages = -(-n // block_size)
            for i in range(pages):
                blk = int(tables[b, i])
                spare.discard(blk)
                used[blk, : min(block_size, n - i * block_size)] = True
        k_cache[~used] = float("nan")
        v_cache[~used] = float("nan")
        spare_block = min(spare)
        for b, n in enumerate(seq_lens):
            tables[b, -(-n // block_size) :] = spare_block
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device=device)
    qsl = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, lens, qsl


@pytest.mark.parametrize(
    ("head_dim", "cfg"),
    [(d, c) for d in (64, 128) for c in _configs(d)],
    ids=[f"d{d}-{_cfg_id(c)}" for d in (64, 128) for c in _configs(d)],
)
def test_prefill_configs(tops, dtype, device, head_dim, cfg):
    if ON_GPU and dtype != torch.bfloat16:
        pytest.skip("candidate configurations are checked in bf16 (fp16 runs the default)")
    q, k_cache, v_cache, tables, lens, qsl = _inputs(CASES, 4, 2, head_dim, 16, dtype, device)
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, 0.09, out=out, config=cfg)
    ref = reference.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, 0.09)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("loop", [0, 1])
def test_prefill_never_reads_unused_slots(tops, dtype, device, block_size, loop):
    q, k_cache, v_cache, tables, lens, qsl = _inputs(
        CASES, 4, 2, 64, block_size, dtype, device, nan_unused=True
    )
    cfg = None if ON_GPU else _cfg(16, 16, loop)
    if ON_GPU:
        from engine_kernels.paged_attention_prefill import CUDA_CONFIGS

        cfg = {**CUDA_CONFIGS[64], "loop": loop}
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, 0.125, out=out, config=cfg)
    # The reference gathers whole pages, NaN included: compare against clean copies.
    clean_k, clean_v = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    ref = reference.paged_attention_prefill(q, clean_k, clean_v, tables, lens, qsl, 0.125)
    assert_close(out, ref, dtype)


@pytest.mark.skipif(not ON_GPU, reason="the CPU runs fp32 in every test")
@pytest.mark.parametrize("head_dim", [64, 128])
def test_prefill_fp32_on_cuda(tops, device, head_dim):
    """The engine's fp32 CUDA path (its CPU-equality check) uses its own, smaller tiles."""
    q, k_cache, v_cache, tables, lens, qsl = _inputs(
        CASES, 4, 2, head_dim, 16, torch.float32, device
    )
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, 0.09, out=out)
    ref = reference.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, 0.09)
    assert_close(out, ref, torch.float32)
