"""The TMA prefill path (``paged_attention_prefill`` given the step's new keys and values) against
the reference: sequences with no cached prefix go to the TMA kernel, the others to the paged
kernel, in one call. On the CPU the TMA kernel runs under Triton's interpreter with small tiles;
on CUDA every candidate configuration the benchmark sweeps is checked.

The new keys and values are views into a fused ``qkv`` buffer, as the engine passes them, and the
cache's unused slots hold NaN: a row computed from the wrong source, or an unwritten output row,
fails.
"""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close, paged_kv_cache

if ON_GPU:
    from engine_kernels.ops import TMA_PREFILL_OPT_IN, tma_prefill_enabled

    pytestmark = pytest.mark.skipif(
        not tma_prefill_enabled(),
        reason=f"opt-in on CUDA ({TMA_PREFILL_OPT_IN}=1): the kernel hung on its first GPU runs",
    )


def _cfg(block_m, block_n, num_warps=4, num_stages=1, ws=0, peel=0, heads_fastest=0,
         maxnreg=0):  # fmt: skip
    """The kernel module's configuration, with the interpreter's defaults (imported lazily, as
    the ``tops`` fixture imports triton)."""
    from engine_kernels.paged_attention_prefill_tma import _cfg as kernel_cfg

    return kernel_cfg(block_m, block_n, num_warps, num_stages, ws, peel,
                      heads_fastest=heads_fastest, maxnreg=maxnreg)  # fmt: skip


def _configs(head_dim: int) -> list[dict]:
    if ON_GPU:
        from engine_kernels.paged_attention_prefill_tma import CANDIDATE_CONFIGS

        return CANDIDATE_CONFIGS[head_dim]
    # peel: the diagonal of a 32-row tile in two key tiles, of a 16-row tile in one;
    # heads_fastest: another mapping of programs to (sequence, tile, head)
    return [_cfg(16, 16), _cfg(32, 16), _cfg(32, 32, ws=1), _cfg(32, 16, peel=1),
            _cfg(16, 16, peel=1), _cfg(16, 16, heads_fastest=1),
            _cfg(32, 16, peel=1, heads_fastest=1, maxnreg=160)]  # fmt: skip


def _name(cfg: dict) -> str:
    from engine_kernels.paged_attention_prefill_tma import config_name

    return config_name(cfg)


# (cached prefix, new tokens): fresh sequences of one token, one tile, odd lengths; sequences with
# a prefix (a later chunk, a decode token of a mixed step); an empty run.
CASES = [(0, 1), (0, 47), (5, 0), (16, 16), (0, 32), (31, 5), (0, 65), (100, 1)]
if ON_GPU:
    CASES += [(0, 700), (333, 259), (0, 4097), (1025, 3)]


def _inputs(cases, heads, kv_heads, head_dim, dtype, device, page=16):
    """q / k_new / v_new as views of one fused qkv buffer; k_new and v_new also stored into a
    paged cache whose other slots hold NaN."""
    q_lens = [n for _, n in cases]
    seq_lens = [c + n for c, n in cases]
    k_cache, v_cache, tables = paged_kv_cache(seq_lens, kv_heads, head_dim, page, dtype, device)
    k_cache.fill_(float("nan"))
    v_cache.fill_(float("nan"))
    tokens = sum(q_lens)
    q_cols, kv_cols = heads * head_dim, kv_heads * head_dim
    qkv = torch.randn(tokens, q_cols + 2 * kv_cols, dtype=dtype, device=device)
    q = qkv[:, :q_cols].view(tokens, heads, head_dim)
    k_new = qkv[:, q_cols : q_cols + kv_cols].view(tokens, kv_heads, head_dim)
    v_new = qkv[:, q_cols + kv_cols :].view(tokens, kv_heads, head_dim)
    slots = []
    for b, (ctx, n) in enumerate(cases):
        for pos in range(ctx + n):  # the prefix gets random keys, the new tokens k_new / v_new
            slot = int(tables[b, pos // page]) * page + pos % page
            if pos < ctx:
                k_cache.view(-1, kv_heads, head_dim)[slot] = torch.randn(kv_heads, head_dim)
                v_cache.view(-1, kv_heads, head_dim)[slot] = torch.randn(kv_heads, head_dim)
            else:
                slots.append(slot)
    slots_t = torch.tensor(slots, dtype=torch.long, device=device)
    reference.store_kvcache(k_new, v_new, k_cache, v_cache, slots_t)
    qsl = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, k_new, v_new, k_cache, v_cache, tables, lens, qsl, max(q_lens)


def _reference(q, k_cache, v_cache, tables, lens, qsl, scale):
    # The reference gathers whole pages, NaN included: compare against clean copies.
    return reference.paged_attention_prefill(
        q.contiguous(), k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0), tables, lens, qsl, scale
    )


# The paged kernel's launch under the interpreter: small tiles (None: its defaults on CUDA).
_PAGED_CPU = None if ON_GPU else {"block_m": 16, "block_n": 16, "num_warps": 4, "num_stages": 1,
                                  "loop": 1}  # fmt: skip


@pytest.mark.parametrize(
    ("head_dim", "cfg"),
    [(d, c) for d in (64, 128) for c in _configs(d)],
    ids=[f"d{d}-{_name(c)}" for d in (64, 128) for c in _configs(d)],
)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (2, 2)])
def test_tma_prefill(tops, dtype, device, head_dim, cfg, heads, kv_heads):
    if ON_GPU and dtype == torch.float32:
        pytest.skip("the TMA kernel takes 16-bit inputs (fp32 runs the paged kernel)")
    from engine_kernels import paged_attention_prefill_tma as tma

    q, k_new, v_new, k_cache, v_cache, tables, lens, qsl, max_q = _inputs(
        CASES, heads, kv_heads, head_dim, dtype, device
    )
    assert tma.supported(q, k_new, v_new), "the engine's qkv views must qualify"
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_prefill(
        q, k_cache, v_cache, tables, lens, qsl, 0.09, max_query_len=max_q, out=out,
        k_new=k_new, v_new=v_new, tma_config=cfg, config=_PAGED_CPU,
        max_prefix_len=max(prefix for prefix, _ in CASES),
    )  # fmt: skip
    assert_close(out, _reference(q, k_cache, v_cache, tables, lens, qsl, 0.09), dtype)


@pytest.mark.parametrize("prefix", [0, 7])
def test_max_prefix_len_zero_spares_the_paged_kernel(tops, dtype, device, monkeypatch, prefix):
    """``max_prefix_len=0`` (no sequence has a cached prefix) with the TMA kernel taking the
    sequences: the paged kernel is not launched, and every row is right. A batch with a prefix,
    given its longest, still launches it (its rows would be left unwritten otherwise)."""
    if ON_GPU and dtype == torch.float32:
        pytest.skip("the TMA kernel takes 16-bit inputs")
    from engine_kernels import paged_attention_prefill as paged

    launches = []
    kernel = paged._prefill_kernel

    class CountingLaunch:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(paged, "_prefill_kernel", CountingLaunch())
    cases = [(0, 20), (prefix, 9), (0, 3)]
    q, k_new, v_new, k_cache, v_cache, tables, lens, qsl, max_q = _inputs(
        cases, 4, 2, 64, dtype, device
    )
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_prefill(
        q, k_cache, v_cache, tables, lens, qsl, 0.125, max_query_len=max_q, out=out,
        k_new=k_new, v_new=v_new, config=_PAGED_CPU, max_prefix_len=prefix,
        tma_config=None if ON_GPU else _cfg(16, 16),
    )  # fmt: skip
    assert len(launches) == (prefix > 0)
    assert_close(out, _reference(q, k_cache, v_cache, tables, lens, qsl, 0.125), dtype)


def test_tma_kernel_writes_only_fresh_sequences(tops, dtype, device):
    """``attend_fresh`` alone: rows of sequences with a cached prefix stay as they were."""
    if ON_GPU and dtype == torch.float32:
        pytest.skip("the TMA kernel takes 16-bit inputs")
    from engine_kernels import paged_attention_prefill_tma as tma

    cases = [(0, 20), (7, 9), (0, 3)]
    q, k_new, v_new, k_cache, v_cache, tables, lens, qsl, max_q = _inputs(
        cases, 4, 2, 64, dtype, device
    )
    out = torch.full_like(q, float("nan"))
    cfg = None if ON_GPU else _cfg(16, 16)
    tma.attend_fresh(q, k_new, v_new, lens, qsl, 0.125, max_query_len=max_q, out=out, config=cfg)
    ref = _reference(q, k_cache, v_cache, tables, lens, qsl, 0.125)
    assert out[20:29].isnan().all(), "a sequence with a prefix is the paged kernel's"
    fresh = torch.cat([torch.arange(0, 20), torch.arange(29, 32)]).to(device)
    assert_close(out[fresh], ref[fresh], dtype)


def test_unsupported_views_fall_back(tops, device):
    """A view TMA cannot address (rows not 16-byte aligned) is refused, not misread."""
    from engine_kernels import paged_attention_prefill_tma as tma

    x = torch.randn(5, 3 * 64 + 4, device=device, dtype=torch.float32)
    q = x[:, :128].view(5, 2, 64)
    odd = x[:, 1:65].view(5, 1, 64)  # starts 4 bytes in
    assert not tma.supported(q, odd, odd)
    assert not tma.supported(q, None, None)


def test_warp_specialised_three_stages_is_refused(tops, device):
    """Warp-specialised with 3 stages left rows NaN on an H100 (Triton 3.6): refused with a clear
    error before anything is launched, everywhere, and ``out`` is left alone."""
    from engine_kernels import paged_attention_prefill_tma as tma

    q, k_new, v_new, _, _, _, lens, qsl, max_q = _inputs(
        [(0, 20)], 4, 2, 64, torch.bfloat16, device
    )
    out = torch.full_like(q, float("nan"))
    cfg = _cfg(128, 64, 4, 3, ws=1)
    with pytest.raises(ValueError, match="at most 2"):
        tma.attend_fresh(q, k_new, v_new, lens, qsl, 0.125, max_query_len=max_q, out=out,
                         config=cfg)  # fmt: skip
    assert out.isnan().all()


def test_warp_specialised_peel_is_refused(tops, device):
    """Triton 3.6's Hopper warp specialisation fails to compile the peeled kernel's second loop:
    refused with a clear error before anything is compiled or launched."""
    from engine_kernels import paged_attention_prefill_tma as tma

    q, k_new, v_new, _, _, _, lens, qsl, max_q = _inputs(
        [(0, 20)], 4, 2, 64, torch.bfloat16, device
    )
    out = torch.full_like(q, float("nan"))
    with pytest.raises(ValueError, match="cannot peel"):
        tma.attend_fresh(q, k_new, v_new, lens, qsl, 0.125, max_query_len=max_q, out=out,
                         config=_cfg(128, 64, 4, 2, ws=1, peel=1))  # fmt: skip
    assert out.isnan().all()
