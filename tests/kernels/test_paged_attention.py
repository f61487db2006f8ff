"""Paged attention (prefill / extend and split decode) against the references.

Pages are scattered through the cache, contexts end on and off page and tile boundaries, and
outputs are poisoned with NaN beforehand so that an unwritten element fails.
"""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference
from tests.kernels.helpers import ON_GPU, assert_close, paged_kv_cache

GQA = [(2, 2), (4, 2), (4, 1), (8, 1)]  # (query heads, kv heads): ratios 1, 2, 4, 8
HEAD_DIMS = [64, 128]

# (cached prefix, new tokens) per sequence: single token, odd lengths, empty, page/tile edges,
# a speculative-verification-like extend of k + 1 tokens on a long prefix.
PREFILL_CASES = {
    "mixed": [(0, 1), (0, 17), (5, 0), (16, 16), (31, 5), (3, 30)],
    "one_token": [(0, 1)],
}
if ON_GPU:
    PREFILL_CASES["long"] = [(0, 1000), (777, 300), (4095, 5), (0, 0), (129, 129), (1, 2049)]


def _prefill_inputs(cases, heads, kv_heads, head_dim, block_size, dtype, device):
    q_lens = [q for _, q in cases]
    seq_lens = [c + q for c, q in cases]
    k_cache, v_cache, tables = paged_kv_cache(
        seq_lens, kv_heads, head_dim, block_size, dtype, device
    )
    q = torch.randn(sum(q_lens), heads, head_dim, dtype=dtype, device=device)
    qsl = torch.tensor([0] + q_lens, device=device).cumsum(0).to(torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, k_cache, v_cache, tables, lens, qsl


@pytest.mark.parametrize("case", list(PREFILL_CASES))
@pytest.mark.parametrize(("heads", "kv_heads"), GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_prefill(tops, dtype, device, case, heads, kv_heads, head_dim):
    q, k_cache, v_cache, tables, lens, qsl = _prefill_inputs(
        PREFILL_CASES[case], heads, kv_heads, head_dim, 16, dtype, device
    )
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, scale, out=out)
    ref = reference.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, scale)
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("block_size", [8, 32])
def test_prefill_block_sizes_and_max_query_len(tops, dtype, device, block_size):
    cases = [(9, 7), (0, 33), (40, 1)]
    q, k_cache, v_cache, tables, lens, qsl = _prefill_inputs(
        cases, 4, 2, 64, block_size, dtype, device
    )
    out = tops.paged_attention_prefill(
        q, k_cache, v_cache, tables, lens, qsl, 0.3, max_query_len=33
    )
    ref = reference.paged_attention_prefill(q, k_cache, v_cache, tables, lens, qsl, 0.3)
    assert_close(out, ref, dtype)


DECODE_LENS = [1, 17, 16, 33, 0, 50, 64]
if ON_GPU:
    DECODE_LENS += [4096, 1023, 2049, 8191]


@pytest.mark.parametrize("num_splits", [1, 3, None])
@pytest.mark.parametrize(("heads", "kv_heads"), GQA)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_decode(tops, dtype, device, num_splits, heads, kv_heads, head_dim):
    k_cache, v_cache, tables = paged_kv_cache(DECODE_LENS, kv_heads, head_dim, 16, dtype, device)
    lens = torch.tensor(DECODE_LENS, dtype=torch.int32, device=device)
    q = torch.randn(len(DECODE_LENS), heads, head_dim, dtype=dtype, device=device)
    scale = head_dim**-0.5
    out = torch.full_like(q, float("nan"))
    tops.paged_attention_decode(
        q, k_cache, v_cache, tables, lens, scale, num_splits=num_splits, out=out
    )
    ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, scale)
    assert_close(out, ref, dtype)
    assert torch.equal(out[4], torch.zeros_like(out[4]))  # the empty sequence


def test_decode_workspace_reused_across_batch_sizes(tops, dtype, device):
    splits = 4
    workspace = tops.decode_workspace(8, 4, 64, splits, device)
    for lens_list in ([5, 70, 33], [128, 1, 2, 3, 64, 65, 7, 100]):
        k_cache, v_cache, tables = paged_kv_cache(lens_list, 2, 64, 16, dtype, device)
        lens = torch.tensor(lens_list, dtype=torch.int32, device=device)
        q = torch.randn(len(lens_list), 4, 64, dtype=dtype, device=device)
        out = tops.paged_attention_decode(
            q, k_cache, v_cache, tables, lens, 0.125, num_splits=splits, workspace=workspace
        )
        ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.125)
        assert_close(out, ref, dtype)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_decode_cuda_graph_replay(tops, dtype, device):
    batch, heads, kv_heads, head_dim, width = 16, 32, 8, 128, 64
    max_lens = [width * 16] * batch
    k_cache, v_cache, tables = paged_kv_cache(max_lens, kv_heads, head_dim, 16, dtype, device)
    lens = torch.full((batch,), 1, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, head_dim, dtype=dtype, device=device)
    splits = tops.default_num_splits(batch, kv_heads, width * 16, device)
    workspace = tops.decode_workspace(batch, heads, head_dim, splits, device)
    out = torch.empty_like(q)

    def step() -> None:
        tops.paged_attention_decode(
            q, k_cache, v_cache, tables, lens, 0.1, num_splits=splits, workspace=workspace, out=out
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for new_lens in ([1000, 1, 17, 512] * 4, torch.randint(0, width * 16, (batch,)).tolist()):
        lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        ref = reference.paged_attention_decode(q, k_cache, v_cache, tables, lens, 0.1)
        assert_close(out, ref, dtype)


PLAN_CONFIGS = {
    "fused": {"fused": 1},
    "unfused": {"fused": 0},
    # Two tiles a unit: a sequence's last unit can end with a tile past its end.
    "32-token tiles": {"block_n": 32},
}


def test_decode_plan_from_config_sizes_the_grid_and_keeps_the_launch_options():
    """``per_sm`` and ``spare`` shape the grid (8 multiprocessors on the CPU); the rest of an
    engine decode config reaches the kernel launch."""
    from engine_kernels.decode_split import DecodePlan

    config = {"per_sm": 2, "spare": 1, "fused": 1}
    plan = DecodePlan.from_config(4, 2, torch.device("cpu"), config)
    assert plan.num_programs == 2 * 8 // 2 - 1
    assert plan.config == {"fused": 1}
    assert config == {"per_sm": 2, "spare": 1, "fused": 1}  # the caller's dict is left alone
    assert DecodePlan.from_config(4, 2, torch.device("cpu")).num_programs == 4 * 8 // 2


@pytest.mark.parametrize("config", list(PLAN_CONFIGS))
@pytest.mark.parametrize("num_programs", [1, 3, 64])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (8, 1), (6, 3)])
def test_decode_planned(tops, dtype, device, num_programs, heads, kv_heads, config):
    """A plan cuts the live contexts into equal chunks; padding rows past the batch get zeros.
    ``fused``: the reduction in the attention kernel or in a second launch (the default)."""
    from engine_kernels.decode_split import DecodePlan, plan_workspace_numel

    lens_list = DECODE_LENS + [300, 129, 128]
    head_dim = 64
    k_cache, v_cache, tables = paged_kv_cache(lens_list, kv_heads, head_dim, 16, dtype, device)
    plan = DecodePlan(len(lens_list) + 2, num_programs, device)
    workspace = torch.empty(plan_workspace_numel(plan.max_items, heads, head_dim), device=device)
    for lens_now in (lens_list, [1] * len(lens_list), [n // 3 for n in lens_list]):
        lens = torch.tensor(lens_now + [1, 1], dtype=torch.int32, device=device)
        plan.fill(lens_now)  # two padding rows, not in the plan
        plan.device.copy_(plan.host)
        tab = torch.cat([tables, tables[:2]])
        q = torch.randn(len(lens_now) + 2, heads, head_dim, dtype=dtype, device=device)
        out = torch.full_like(q, float("nan"))
        tops.paged_attention_decode(
            q, k_cache, v_cache, tab, lens, head_dim**-0.5, out=out, plan=plan,
            workspace=workspace, config=PLAN_CONFIGS[config],
        )  # fmt: skip
        n = len(lens_now)
        ref = reference.paged_attention_decode(
            q[:n], k_cache, v_cache, tables, lens[:n], head_dim**-0.5
        )
        assert_close(out[:n], ref, dtype)
        assert torch.equal(out[n:], torch.zeros_like(out[n:]))
