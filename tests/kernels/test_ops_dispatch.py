"""``engine_kernels.ops`` takes the reference off CUDA or if REFERENCE_ENGINE_KERNELS=reference."""

from __future__ import annotations

import torch

from engine_kernels import ops, reference


def test_cpu_calls_take_the_reference():
    assert ops._backend(torch.empty(1)) is reference
    x = torch.randn(3, 2, 8)
    assert torch.equal(ops.silu_and_mul(x), reference.silu_and_mul(x))


def test_env_forces_reference(monkeypatch):
    monkeypatch.setenv("REFERENCE_ENGINE_KERNELS", "reference")
    t = torch.empty(1, device="cuda") if torch.cuda.is_available() else torch.empty(1)
    assert ops._backend(t) is reference


def test_decode_out_and_workspace_accepted_on_reference():
    q = torch.randn(2, 4, 16)
    cache = torch.randn(3, 4, 2, 16)
    tables = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32)
    lens = torch.tensor([5, 3], dtype=torch.int32)
    out = torch.empty_like(q)
    ws = ops.decode_workspace(2, 4, 16, 2, "cpu")
    got = ops.paged_attention_decode(q, cache, cache, tables, lens, 0.25, workspace=ws, out=out)
    assert got is out
    assert torch.equal(out, reference.paged_attention_decode(q, cache, cache, tables, lens, 0.25))
