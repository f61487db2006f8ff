"""Model shapes for benchmarks beyond the test fixtures, built on first use from fixed seeds.

    python -m benchmarks.throughput --model small-llama ...   # builds results/models/small-llama

The fixture models are sized for tests (hidden 128, 2 layers), so per-step overheads decide
their throughput. A benchmark shape is a larger Llama with the same tokenizer and the fixtures'
weight recipe (peaked next-token distributions), too big to commit, so it is written to
``results/models/<name>`` (gitignored) once and reused; the seeds make it identical every time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "results" / "models"

# name -> LlamaConfig fields on top of the fixtures' common ones
SHAPES: dict[str, dict] = {
    # 4x the fixture's width and twice its depth, grouped-query attention 4:2.
    "small-llama": dict(
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
    ),
}


def resolve(model: str) -> str:
    """A benchmark shape's folder (built if missing), or ``model`` itself if it is not one."""
    if model not in SHAPES:
        return model
    folder = CACHE / model
    if not (folder / "config.json").exists():
        build(model, folder)
    return str(folder)


def build(name: str, folder: Path) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from fixtures import build_fixtures as fx

    config = LlamaConfig(
        **{**fx.COMMON, **SHAPES[name]}, tie_word_embeddings=False, rope_theta=10000.0
    )
    torch.manual_seed(fx.SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    fx.init_weights(model, seed=fx.SEED + 100 + sorted(SHAPES).index(name))
    model.generation_config = GenerationConfig(
        bos_token_id=fx.BOS_ID, eos_token_id=fx.EOS_ID, pad_token_id=fx.PAD_ID
    )
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    for f in (ROOT / "fixtures" / "tokenizer").iterdir():  # the fixtures' tokenizer, as is
        shutil.copy(f, partial / f.name)
    partial.rename(folder)  # complete or absent: a killed build leaves no half model behind
