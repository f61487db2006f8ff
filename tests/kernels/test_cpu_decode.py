"""The CPU's C++ decode attention (``engine_kernels.cpu_decode``) against the PyTorch path it
replaces when opted in: same contract, same results within fp32 rounding, on head-major and
contiguous caches, grouped and one-to-one heads, contexts on and off block edges, rows with no
context; and ``ops.paged_attention_decode`` takes it only when asked to."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import cpu_decode, ops, reference
from tests.kernels.helpers import paged_kv_cache
from tests.kernels.test_head_major_cache import head_major

pytestmark = pytest.mark.skipif(
    not cpu_decode.available(), reason="the C++ kernel cannot be built here (compiler, ninja)"
)

LENS = {
    "edges": [1, 15, 16, 17, 32, 33],
    "with empty rows": [0, 5, 0, 40],
    "40 rows": [3 + 11 * i for i in range(40)],
    "one long": [700],
}


@pytest.mark.parametrize("lens", LENS.values(), ids=LENS.keys())
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("layout", ["head-major", "contiguous"])
def test_equals_the_pytorch_path(lens, heads: int, kv_heads: int, layout: str) -> None:
    torch.manual_seed(len(lens) * heads)
    k, v, tables = paged_kv_cache(lens, kv_heads, 64, 16, torch.float32, "cpu")
    if layout == "head-major":
        k, v = head_major(k), head_major(v)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(len(lens), heads, 64)
    got = cpu_decode.paged_attention_decode(q, k, v, tables, seq_lens, 0.125)
    want = reference.paged_attention_decode(q, k, v, tables, seq_lens, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for b in (seq_lens == 0).nonzero().flatten().tolist():
        assert torch.equal(got[b], torch.zeros_like(got[b]))


def test_what_it_supports() -> None:
    k, v, _ = paged_kv_cache([4], 2, 64, 16, torch.float32, "cpu")
    q = torch.randn(1, 4, 64)
    assert cpu_decode.supports(q, k, v)
    assert not cpu_decode.supports(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert not cpu_decode.supports(q, k.transpose(1, 3), v)  # head dim not of unit stride
    assert not cpu_decode.supports(torch.randn(1, 3, 64), k, v)  # 3 query heads on 2


@pytest.mark.parametrize("opted_in", [False, True])
def test_ops_takes_it_only_when_opted_in(opted_in: bool, monkeypatch) -> None:
    monkeypatch.setenv(cpu_decode.OPT_IN, "1" if opted_in else "0")
    torch.manual_seed(0)
    k, v, tables = paged_kv_cache([9, 70, 33], 2, 64, 16, torch.float32, "cpu")
    seq_lens = torch.tensor([9, 70, 33], dtype=torch.int32)
    q = torch.randn(3, 4, 64)
    got = ops.paged_attention_decode(q, k, v, tables, seq_lens, 0.125)
    cpp = cpu_decode.paged_attention_decode(q, k, v, tables, seq_lens, 0.125)
    torch_path = reference.paged_attention_decode(q, k, v, tables, seq_lens, 0.125)
    assert not torch.equal(cpp, torch_path), "construction: the two paths round differently"
    assert torch.equal(got, cpp if opted_in else torch_path)
