"""Turns logits into tokens: greedy, temperature, top-k, top-p, min-p, seeds, logprobs, and the
verification of speculative drafts (exact for greedy; rejection sampling otherwise).

Sampling draws ``argmax(probs / E)`` with ``E ~ Exp(1)`` noise (the exponential race, equal in
law to sampling from ``probs``): a seeded request's noise comes from its own generator, so its
tokens do not depend on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reference_engine.outputs import Logprob
from reference_engine.request import Request


@dataclass
class SampledTokens:
    token_ids: list[int]
    num_accepted_drafts: int = 0
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    token_logprobs: list[float] = field(default_factory=list)


class Sampler:
    def __init__(self, seed: int, device: torch.device):
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[SampledTokens]:
        """``logits`` holds ``1 + len(req.spec_token_ids)`` consecutive rows per request."""
        row_counts = [1 + len(r.spec_token_ids) for r in requests]
        row_reqs = [r for r, n in zip(requests, row_counts) for _ in range(n)]
        row_offsets = [j for n in row_counts for j in range(n)]
        raw_logprobs = None
        if any(r.params.logprobs is not None for r in requests):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self._mask_min_tokens(logits, row_reqs, row_offsets)
        chosen = logits.argmax(dim=-1)
        probs = None
        if not all(r.params.greedy for r in requests):
            probs = self._probs(logits, row_reqs)
            sampled = self._race(probs, row_reqs, row_offsets)
            greedy = _col([r.params.greedy for r in row_reqs], logits)
            chosen = torch.where(greedy, chosen, sampled)
        chosen_list = chosen.tolist()

        results, row = [], 0
        for req, n in zip(requests, row_counts):
            drafts = req.spec_token_ids
            if not drafts:
                tokens = [chosen_list[row]]
            elif req.params.greedy:
                tokens = _verify_greedy(drafts, chosen_list[row : row + n])
            else:
                tokens = self._verify_sampled(req, drafts, probs[row : row + n])
            out = SampledTokens(tokens, num_accepted_drafts=len(tokens) - 1)
            if raw_logprobs is not None and req.params.logprobs is not None:
                for j, tok in enumerate(tokens):
                    entry, lp = _logprobs(raw_logprobs[row + j], tok, req.params.logprobs)
                    out.logprobs.append(entry)
                    out.token_logprobs.append(lp)
            results.append(out)
            row += n
        return results

    @staticmethod
    def _mask_min_tokens(
        logits: torch.Tensor, row_reqs: list[Request], row_offsets: list[int]
    ) -> torch.Tensor:
        masked = None
        for i, (req, j) in enumerate(zip(row_reqs, row_offsets)):
            if req.num_output_tokens + j < req.params.min_tokens:
                banned = req.params.stop_token_ids + (
                    [] if req.params.ignore_eos else req.eos_token_ids
                )
                if banned:
                    masked = logits.clone() if masked is None else masked
                    masked[i, banned] = float("-inf")
        return logits if masked is None else masked

    @staticmethod
    def _probs(logits: torch.Tensor, row_reqs: list[Request]) -> torch.Tensor:
        params = [r.params for r in row_reqs]
        temp = _col([1.0 if p.greedy else p.temperature for p in params], logits, torch.float32)
        x = logits / temp
        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):
            sorted_x, order = x.sort(dim=-1, descending=True)
            ranks = torch.arange(x.shape[-1], device=x.device)[None, :]
            top_k = _col([p.top_k if p.top_k > 0 else x.shape[-1] for p in params], x, torch.long)
            drop = ranks >= top_k
            sorted_probs = sorted_x.masked_fill(drop, float("-inf")).softmax(dim=-1)
            top_p = _col([p.top_p for p in params], x, torch.float32)
            drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) > top_p  # keeps the top token
            x = torch.full_like(x, float("-inf")).scatter(
                -1, order, sorted_x.masked_fill(drop, float("-inf"))
            )
        probs = x.softmax(dim=-1)
        if any(p.min_p > 0 for p in params):
            min_p = _col([p.min_p for p in params], x, torch.float32)
            probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs

    def _race(
        self, probs: torch.Tensor, row_reqs: list[Request], row_offsets: list[int]
    ) -> torch.Tensor:
        noise = torch.empty_like(probs).exponential_(generator=self.generator)
        for i, (req, j) in enumerate(zip(row_reqs, row_offsets)):
            # Drafted rows of a seeded request are verified with its generator instead.
            if (
                req.generator is not None
                and not req.params.greedy
                and j == 0
                and not req.spec_token_ids
            ):
                noise[i] = _exponential(probs.shape[-1], req.generator).to(probs.device)
        return (probs / noise).argmax(dim=-1)

    def _verify_sampled(self, req: Request, drafts: list[int], probs: torch.Tensor) -> list[int]:
        """Rejection sampling against a point-mass draft: accept draft ``d`` with probability
        ``p(d)``; on rejection draw from ``p`` without ``d``, renormalised."""
        gen = req.generator
        accepted: list[int] = []
        for j, d in enumerate(drafts):
            p = probs[j].double().cpu()
            u = (
                torch.rand(1, generator=gen, dtype=torch.float64)
                if gen
                else torch.rand(1, dtype=torch.float64)
            )
            if u.item() < p[d].item():
                accepted.append(d)
                continue
            residual = p.clone()
            residual[d] = 0.0
            if residual.sum() <= 0:
                residual = p
            return accepted + [_draw(residual, gen)]
        return accepted + [_draw(probs[len(drafts)].double().cpu(), gen)]


def _verify_greedy(drafts: list[int], argmax_ids: list[int]) -> list[int]:
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == argmax_ids[accepted]:
        accepted += 1
    return drafts[:accepted] + [argmax_ids[accepted]]


def _draw(p: torch.Tensor, gen: torch.Generator | None) -> int:
    noise = _exponential(p.shape[-1], gen) if gen else torch.empty(p.shape[-1]).exponential_()
    return int((p / noise.double()).argmax())


def _exponential(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.empty(n).exponential_(generator=gen)


def _col(values: list, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return (
        torch.tensor(values, dtype=dtype, device=like.device)[:, None]
        if dtype
        else torch.tensor(values, device=like.device)
    )


def _logprobs(row: torch.Tensor, token: int, top_n: int) -> tuple[dict[int, Logprob], float]:
    lp = row[token].item()
    rank = int((row > row[token]).sum()) + 1
    entry = {token: Logprob(lp, rank)}
    if top_n > 0:
        values, ids = row.topk(top_n)
        for r, (v, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
            entry.setdefault(i, Logprob(v, r))
    return entry, lp
