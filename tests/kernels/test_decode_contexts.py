"""The CPU decode's kept contexts (``reference._decode_contexts``): inside ``step_cache()``, a
decode step that continues the previous one adds each sequence's new token to the contexts
gathered before instead of gathering them again. Its attention must equal a fresh gather's step
after step, across block boundaries, two length groups and two layers (bit for bit in one group;
within fp32 rounding in two, whose cut a continued batch keeps while a fresh plan may move it,
and so pad to another length); and anything other than a continuation (a prefill's writes,
another batch) must gather again."""

from __future__ import annotations

import pytest
import torch

from engine_kernels import reference

BLOCK, HEADS, DIM, SCALE = 16, 4, 32, 0.125


class Decoding:
    """Sequences decoding one token a step into two layers' head-major caches, as the engine's
    model does: store the new token's K/V, then attend."""

    def __init__(self, lens: list[int], kv_heads: int, steps: int, seed: int = 0):
        torch.manual_seed(seed)
        width = -(-(max(lens) + steps) // BLOCK)
        blocks = len(lens) * width + 1
        self.layers = []
        for _ in range(2):
            k = reference.new_kv_cache(blocks, BLOCK, kv_heads, DIM, torch.float32, "cpu")
            v = reference.new_kv_cache(blocks, BLOCK, kv_heads, DIM, torch.float32, "cpu")
            k.copy_(torch.randn(k.shape))
            v.copy_(torch.randn(v.shape))
            self.layers.append((k, v))
        perm = torch.randperm(blocks)[: len(lens) * width]
        self.tables = perm.view(len(lens), width).to(torch.int32)
        self.seq_lens = torch.tensor(lens, dtype=torch.int32)
        self.kv_heads = kv_heads

    def write(self, row: int, pos: int) -> None:
        """New K/V at a row's position, in every layer."""
        block, offset = int(self.tables[row, pos // BLOCK]), pos % BLOCK
        for k, v in self.layers:
            k[block, offset] = torch.randn(self.kv_heads, DIM)
            v[block, offset] = torch.randn(self.kv_heads, DIM)

    def step(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One decode step: (kept, fresh) attention outputs of each layer."""
        for row, n in enumerate(self.seq_lens.tolist()):
            self.write(row, n)
        self.seq_lens = self.seq_lens + 1
        q = torch.randn(len(self.seq_lens), HEADS, DIM)
        with reference.step_cache():
            kept = [self.attend(q, k, v) for k, v in self.layers]
        return kept, [self.attend(q, k, v) for k, v in self.layers]

    def attend(self, q, k, v) -> torch.Tensor:
        return reference.paged_attention_decode(q, k, v, self.tables, self.seq_lens, SCALE)


@pytest.fixture
def gathers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many contexts each step gathered inside ``step_cache()`` (both layers, K and V)."""
    counted: list[int] = []
    gather = reference._gather

    def counting(*args, **kwargs):
        if reference._STEP.active:
            counted.append(1)
        return gather(*args, **kwargs)

    monkeypatch.setattr(reference, "_gather", counting)
    return counted


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize(
    "lens", [[1, 17, 5], [3 + 7 * i for i in range(20)] + [180 + i for i in range(20)]],
    ids=["3 rows", "40 rows in two groups"],
)  # fmt: skip
def test_kept_contexts_equal_a_fresh_gather(
    lens: list[int], kv_heads: int, gathers: list[int]
) -> None:
    run = Decoding(lens, kv_heads, steps=40)
    per_step = []
    for _ in range(40):
        before = len(gathers)
        kept, fresh = run.step()
        for a, b in zip(kept, fresh):
            torch.testing.assert_close(a, b)
            assert len(lens) > 3 or torch.equal(a, b)
        per_step.append(len(gathers) - before)
    groups = len(reference._CONTEXTS.plan.groups)
    assert groups == (2 if len(lens) == 40 else 1), "construction: the groups meant"
    assert per_step[0] == 2 * 2 * groups, "the first step gathers every context"
    # 40 steps cross two or three block boundaries: room for them is kept, and a context whose
    # room runs out is gathered again, but most steps gather nothing.
    assert sum(n == 0 for n in per_step) >= 30, per_step


def test_a_prefill_between_decode_steps_gathers_again(gathers: list[int]) -> None:
    run = Decoding([20, 33, 7], 2, steps=6)
    for _ in range(3):
        run.step()
    # A prompt's tokens written over a context that the kept copy holds (a request that took the
    # blocks of one that left), then attended by the prefill as the engine's model does.
    run.write(0, 5)
    q = torch.randn(1, HEADS, DIM)
    k, v = run.layers[0]
    start = torch.tensor([0, 1], dtype=torch.int32)
    reference.paged_attention_prefill(q, k, v, run.tables[:1], run.seq_lens[:1], start, SCALE)
    before = len(gathers)
    kept, fresh = run.step()
    assert len(gathers) > before, "the step after a prefill gathers"
    for a, b in zip(kept, fresh):
        assert torch.equal(a, b)


def test_a_write_the_kept_contexts_are_not_told_of_shows(gathers: list[int]) -> None:
    """Construction of the test above: without the prefill, the kept copy is stale; so it is the
    prefill's invalidation that keeps them equal there (and every write other than a decode
    token's must go through one)."""
    run = Decoding([20, 33, 7], 2, steps=6)
    for _ in range(3):
        run.step()
    run.write(0, 5)
    kept, fresh = run.step()
    assert not torch.equal(kept[0], fresh[0])


@pytest.mark.parametrize("change", ["reordered", "one left", "one a token ahead", "new block"])
def test_a_batch_that_does_not_continue_gathers_again(change: str, gathers: list[int]) -> None:
    run = Decoding([20, 33, 7, 12], 2, steps=8)
    for _ in range(3):
        run.step()
    if change == "reordered":
        order = torch.tensor([1, 0, 2, 3])
        run.tables, run.seq_lens = run.tables[order], run.seq_lens[order]
    elif change == "one left":
        run.tables, run.seq_lens = run.tables[:3], run.seq_lens[:3]
    elif change == "one a token ahead":
        run.write(2, int(run.seq_lens[2]))
        run.seq_lens[2] += 1
    else:  # a row's last block replaced by another one, with other contents
        run.tables = run.tables.clone()
        last = (int(run.seq_lens[1]) - 1) // BLOCK
        run.tables[1, last] = run.tables[3, -1]
    before = len(gathers)
    kept, fresh = run.step()
    assert len(gathers) > before
    for a, b in zip(kept, fresh):
        assert torch.equal(a, b)
