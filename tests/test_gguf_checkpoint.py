"""The GGUF writer the llama.cpp column of the matrix serves from: each fixture checkpoint read
back with the ``gguf`` package's own reader has its shape, its vocabulary and its weights, with
llama's q/k rows in the order llama.cpp's rotary expects."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conformance import fixtures
from conformance.gguf_checkpoint import interleave_rotary_rows, write_gguf

gguf = pytest.importorskip("gguf")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_the_checkpoint_reads_back_whole(name: str, tmp_path: Path) -> None:
    model = Path(fixtures.model_path(name))
    config = json.loads((model / "config.json").read_text())
    reader = gguf.GGUFReader(write_gguf(model, tmp_path / f"{name}.gguf"))
    arch = reader.fields["general.architecture"].contents()
    assert reader.fields[f"{arch}.context_length"].contents() == config["max_position_embeddings"]
    assert reader.fields[f"{arch}.block_count"].contents() == config["num_hidden_layers"]
    kv_heads = reader.fields[f"{arch}.attention.head_count_kv"].contents()
    assert kv_heads == config["num_key_value_heads"]
    vocab = json.loads((model / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(reader.fields["tokenizer.ggml.tokens"].contents()) >= len(vocab)

    tensors = {t.name: np.asarray(t.data) for t in reader.tensors}
    weights = {}
    for path in model.glob("*.safetensors"):
        weights.update(safetensors_numpy.load_file(path))
    assert len(tensors) >= len(weights)
    embed = weights["model.embed_tokens.weight"].astype(np.float32)
    assert np.array_equal(tensors["token_embd.weight"].reshape(embed.shape), embed)
    q = weights["model.layers.0.self_attn.q_proj.weight"].astype(np.float32)
    if arch == "llama":  # llama.cpp rotates interleaved pairs, HF the two halves of a head
        q = interleave_rotary_rows(q, config["num_attention_heads"])
    assert np.array_equal(tensors["blk.0.attn_q.weight"].reshape(q.shape), q)
