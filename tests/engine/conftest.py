import pytest
import torch
from transformers import AutoModelForCausalLM

from fixtures import ALL_MODELS, model_path


@pytest.fixture(scope="session")
def hf_greedy():
    """``hf_greedy(model, prompt_ids, n) -> ids``: HF transformers' greedy continuation (fp32),
    the independent oracle. EOS is suppressed (``min_new_tokens``) so lengths are fixed."""
    models = {}

    def generate(name: str, prompt_ids: list[int], n: int) -> list[int]:
        if name not in models:
            models[name] = AutoModelForCausalLM.from_pretrained(
                model_path(name), dtype=torch.float32
            )
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            # An explicit mask: HF would otherwise mask any prompt token equal to pad_token_id.
            out = models[name].generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
        return out[0, len(prompt_ids) :].tolist()

    return generate


@pytest.fixture(params=ALL_MODELS)
def model_name(request) -> str:
    return request.param
