"""Sampler internals: rejection sampling of drafts keeps the target distribution exactly."""

import torch

from reference_engine.request import Request
from reference_engine.sampler import Sampler
from reference_engine.sampling_params import SamplingParams


def test_rejection_sampling_of_a_point_draft_reproduces_the_target_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    sampler = Sampler(seed=0, device=torch.device("cpu"))
    req = Request("r", None, [1], SamplingParams(temperature=1.0, seed=7), eos_token_ids=[])
    trials = 20000
    counts = torch.zeros(4)
    for _ in range(trials):
        first = sampler._verify_sampled(req, [1], probs)[0]  # draft token 1, p(1) = 0.3
        counts[first] += 1
    # Whatever the draft, the first emitted token must follow probs[0] (binomial 5-sigma band).
    freq = counts / trials
    sigma = (probs[0] * (1 - probs[0]) / trials).sqrt()
    assert ((freq - probs[0]).abs() <= 5 * sigma + 1e-3).all(), freq


def test_greedy_rows_ignore_noise_and_seeded_rows_ignore_the_batch():
    sampler = Sampler(seed=0, device=torch.device("cpu"))
    logits = torch.randn(3, 50)
    greedy = Request("g", None, [1], SamplingParams(temperature=0), eos_token_ids=[])
    seeded = [
        Request(f"s{i}", None, [1], SamplingParams(temperature=1.0, seed=5), eos_token_ids=[])
        for i in range(2)
    ]
    out = sampler(logits, [greedy, *seeded])
    assert out[0].token_ids == [int(logits[0].argmax())]
    alone = Sampler(seed=1, device=torch.device("cpu"))(
        logits[1:2],
        [Request("x", None, [1], SamplingParams(temperature=1.0, seed=5), eos_token_ids=[])],
    )
    assert out[1].token_ids == alone[0].token_ids


def test_min_tokens_masks_eos_and_stop_ids():
    sampler = Sampler(seed=0, device=torch.device("cpu"))
    logits = torch.zeros(1, 10)
    logits[0, 3] = 100.0  # EOS would win
    logits[0, 4] = 50.0  # then the stop token
    req = Request(
        "r",
        None,
        [1],
        SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4]),
        eos_token_ids=[3],
    )
    assert sampler(logits, [req])[0].token_ids not in ([3], [4])
