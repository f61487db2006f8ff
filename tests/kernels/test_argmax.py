"""The Triton greedy argmax (engine_kernels/argmax.py) gives torch.argmax's index exactly: ties
to the first index, also across chunks, NaN above everything, columns past the row never read.

Most cases cut rows into small chunks (``chunk=32, block=16``: chunk c holds columns 32c to
32c + 31, two loop steps of 16 lanes) so that chunk and lane boundaries sit where ties are planted.
"""

from __future__ import annotations

import pytest
import torch

from engine_kernels import ops, reference
from tests.kernels.helpers import ON_GPU

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
NAN, INF = float("nan"), float("inf")
SMALL = {"chunk": 32, "block": 16}


@pytest.fixture
def argmax(tops):
    """``engine_kernels.argmax.greedy_argmax``, where the Triton kernels can run."""
    from engine_kernels.argmax import greedy_argmax

    return greedy_argmax


@pytest.fixture
def dev() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")


def _check(out: torch.Tensor, logits: torch.Tensor, expected: list[int] | None = None) -> None:
    ref = logits.argmax(dim=-1)
    assert out.dtype == torch.int64 and out.device == logits.device
    assert torch.equal(out, ref), (out.tolist(), ref.tolist())
    if expected is not None:  # the planted answer, in case torch's ever changed
        assert out.tolist() == expected


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize(
    ("n", "vocab", "chunk", "block"),
    [(1, 1000, 64, 32), (3, 1000, 64, 32), (64, 200, 32, 16), (3, 1000, None, 1024),
     (257, 100, None, 16), (1, 7, None, 16)],
)  # fmt: skip
def test_random_rows(argmax, dev, dt, n, vocab, chunk, block):
    # 1000 and 200 are no multiple of the chunk: the last chunk ends inside a loop step.
    logits = torch.randn(n, vocab, device=dev).to(dt)
    _check(argmax(logits, chunk=chunk, block=block), logits)


def test_float64_keeps_its_precision(argmax, dev):
    logits = torch.zeros(2, 100, dtype=torch.float64, device=dev)
    logits[:, 10] = 1.0
    logits[:, 70] = 1.0 + 1e-12  # equal to 1.0 in fp32
    _check(argmax(logits, **SMALL), logits, [70, 70])


@pytest.mark.parametrize("n", [1, 2])
def test_real_vocab(argmax, dev, n):
    from engine_kernels.argmax import chunk_size

    vocab = 151936
    logits = torch.randn(n, vocab, device=dev).to(torch.bfloat16)
    _check(argmax(logits), logits)
    # The same maximum at the last column of the default chunking's chunk 0 and the first of
    # chunk 1; then at a chunk's first column and the row's last.
    chunk = chunk_size(n, vocab, logits.device)
    assert vocab > 2 * chunk
    logits[0, chunk - 1] = logits[0, chunk] = 100.0
    logits[-1, 2 * chunk] = logits[-1, vocab - 1] = 100.0
    expected = [chunk - 1] if n == 1 else [chunk - 1, 2 * chunk]
    _check(argmax(logits), logits, expected)


def _planted(dev: torch.device, dt: torch.dtype, rows: list[dict[int, float]], vocab: int = 200):
    """Rows of values in [-1, 0) with ``{column: value}`` planted in each."""
    logits = -torch.rand(len(rows), vocab, device=dev)
    for r, planted in enumerate(rows):
        for col, v in planted.items():
            logits[r, col] = v
    return logits.to(dt)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_ties_go_to_the_first_index(argmax, dev, dt):
    rows = [
        {31: 2.0, 32: 2.0},  # last of chunk 0, first of chunk 1
        {32: 2.0, 199: 2.0},  # first of chunk 1, last of the row (a partial loop step)
        {5: 2.0, 21: 2.0},  # one lane, two loop steps of a chunk
        {9: 2.0, 5: 2.0},  # two lanes of one loop step
        {40: 2.0, 8: 2.0, 100: 2.0},  # chunks 0, 1 and 3, the first not in lane 0
        {150: 2.0, 170: 2.0, 199: 2.0},  # only in later chunks
        {198: 2.0, 199: 2.0},  # inside the last, partial step
    ]
    logits = _planted(dev, dt, rows)
    _check(argmax(logits, **SMALL), logits, [31, 32, 5, 5, 8, 150, 198])


@pytest.mark.parametrize("fill", [-INF, 0.0, 3.5])
def test_constant_rows_give_zero(argmax, dev, fill):
    logits = torch.full((3, 200), fill, device=dev)
    _check(argmax(logits, **SMALL), logits, [0, 0, 0])


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_nan_is_the_maximum(argmax, dev, dt):
    rows = [
        {150: NAN, 3: 2.0},  # a NaN in a later chunk beats a larger-looking value
        {150: NAN, 40: NAN, 70: NAN},  # the first NaN of several chunks
        {4: NAN, 20: NAN},  # two NaNs in one lane: the earlier stays
        {20: NAN, 4: INF},  # a NaN after +inf
        {199: NAN, 0: INF, 100: INF},  # only NaN at the row's last column
        {33: NAN, 32: -INF},
    ]
    logits = _planted(dev, dt, rows)
    _check(argmax(logits, **SMALL), logits, [150, 40, 4, 20, 199, 33])
    all_nan = torch.full((2, 200), NAN, device=dev).to(dt)
    _check(argmax(all_nan, **SMALL), all_nan, [0, 0])


@pytest.mark.parametrize(("chunk", "block"), [(32, 16), (None, 16), (None, 256)])
def test_columns_past_the_row_are_not_read(argmax, dev, chunk, block):
    # Rows of 200 in a buffer 232 wide whose padding is NaN: a read past the row would win.
    buf = torch.full((5, 232), NAN, device=dev)
    logits = buf[:, :200]
    logits.copy_(torch.randn(5, 200, device=dev))
    _check(argmax(logits, chunk=chunk, block=block), logits)


def test_empty_batch_and_layout(argmax, dev):
    out = argmax(torch.randn(0, 300, device=dev).to(torch.bfloat16))
    assert out.shape == (0,) and out.dtype == torch.int64
    with pytest.raises(AssertionError):
        argmax(torch.randn(300, 4, device=dev).t())


def test_chunk_size_spreads_small_batches():
    from engine_kernels.argmax import BLOCK, chunk_size

    cpu, vocab = torch.device("cpu"), 151936
    for n in (1, 8, 32, 64, 128, 256, 1024):
        chunk = chunk_size(n, vocab, cpu)
        chunks = -(-vocab // chunk)
        assert chunk % BLOCK == 0
        assert n * chunks >= min(2 * 132, n * (vocab // BLOCK)), (n, chunks)
        assert n * chunks <= max(8 * 132, n), (n, chunks)
    assert chunk_size(4, 100, cpu, block=16) == 16  # 7 blocks: a chunk each


def test_ops_takes_the_reference_unless_opted_in(monkeypatch):
    monkeypatch.delenv(ops.ARGMAX_OPT_IN, raising=False)
    assert not ops.argmax_enabled()
    logits = torch.randn(4, 1000).to(torch.bfloat16)
    logits[1, 7] = logits[1, 900] = 50.0
    assert torch.equal(ops.greedy_argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(reference.greedy_argmax(logits), logits.argmax(dim=-1))
    monkeypatch.setenv(ops.ARGMAX_OPT_IN, "1")
    assert ops.argmax_enabled()
    assert torch.equal(ops.greedy_argmax(logits), logits.argmax(dim=-1))  # CPU: still torch's
