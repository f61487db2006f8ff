"""The projection weights packed in read order for the decode attention's L2 prefetch."""

from __future__ import annotations

import pytest
import torch

from fixtures import model_path
from reference_engine.config import ModelConfig
from reference_engine.models import load_model
from reference_engine.models.weight_layout import MAX_L2_SHARE, pack_for_l2_prefetch


@pytest.fixture(autouse=True)
def _opted_in(monkeypatch):
    monkeypatch.setenv("ENGINE_KERNELS_L2_PREFETCH", "1")


def _model():
    cfg = ModelConfig.from_folder(model_path("tiny-qwen3"))
    return load_model(cfg, torch.device("cpu"), torch.float32)


def _projections(model):
    return [
        lin
        for layer in model.layers
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                    layer.mlp.gate_up_proj, layer.mlp.down_proj)
    ]  # fmt: skip


def test_packed_weights_keep_their_values_in_read_order():
    """Every projection keeps its values and shape, as consecutive views of one buffer in the
    order a step reads them; each layer's range runs from its o projection to the end of the
    next layer's qkv projection (the last layer's to the end of its down projection)."""
    model = _model()
    before = [lin.weight.clone() for lin in _projections(model)]
    assert pack_for_l2_prefetch(model, l2_bytes=1 << 40)
    linears = _projections(model)
    for lin, old in zip(linears, before):
        assert torch.equal(lin.weight, old) and lin.weight.is_contiguous()
    base = linears[0].weight.untyped_storage().data_ptr()
    offset = 0
    for lin in linears:
        assert lin.weight.untyped_storage().data_ptr() == base
        assert lin.weight.data_ptr() == base + offset
        offset += lin.weight.nbytes
    layers = list(model.layers)
    for i, layer in enumerate(layers):
        rng = layer.self_attn.l2_prefetch
        assert rng.data_ptr() == linears[4 * i + 1].weight.data_ptr()
        last = linears[min(4 * i + 4, len(linears) - 1)].weight
        assert rng.data_ptr() + rng.nbytes == last.data_ptr() + last.nbytes


def test_nothing_packed_when_the_range_would_crowd_l2():
    """A layer's next weights larger than ``MAX_L2_SHARE`` of L2 (a larger model) are not
    prefetched: the context streaming past would evict them before their GEMMs."""
    model = _model()
    linears = _projections(model)
    span = max(sum(lin.weight.nbytes for lin in linears[i + 1 : i + 5])
               for i in range(0, len(linears), 4))  # fmt: skip
    ptrs = [lin.weight.data_ptr() for lin in linears]
    assert not pack_for_l2_prefetch(model, l2_bytes=int(span / MAX_L2_SHARE) - 1)
    assert [lin.weight.data_ptr() for lin in linears] == ptrs
    assert all(layer.self_attn.l2_prefetch is None for layer in model.layers)
    assert pack_for_l2_prefetch(model, l2_bytes=int(span / MAX_L2_SHARE) + 1)


def test_off_on_the_cpu_and_unless_opted_in(monkeypatch):
    model = _model()
    assert not pack_for_l2_prefetch(model)  # no GPU L2 to size it by
    monkeypatch.delenv("ENGINE_KERNELS_L2_PREFETCH")
    assert not pack_for_l2_prefetch(model, l2_bytes=1 << 40)
