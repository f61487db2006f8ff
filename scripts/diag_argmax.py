"""The decode step's greedy argmax on the GPU, torch's against engine_kernels/argmax.py.

Times ``logits.argmax(dim=-1)`` and the Triton ``greedy_argmax`` on bf16 logits ``[n, 151936]``
(Qwen3-0.6B's vocab) at the decode batch sizes, each result checked equal to torch's.

Each rep reads rows that no recent rep read, from ``--copies`` buffers of ``[256, vocab]``
(622 MB at 8), so the logits come from HBM and not from L2; a sleep kernel queued first keeps
the launches off the clock. Times are medians of ``--reps`` reps, in us, from CUDA events; GB/s
is the logits' bytes over that time. ``--sweep`` also times the kernel at other loop blocks and
programs per SM (the chunk sizing of ``chunk_size``) and prints the best per batch size.

    python scripts/diag_argmax.py [--ns 1,8,32,64,128,256] [--reps 50] [--sweep]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from engine_kernels.argmax import BLOCK, PROGRAMS_PER_SM, chunk_size, greedy_argmax

VOCAB = 151936
ROWS = 256


def _median_us(fn: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor, n: int, reps: int):
    """Median us of ``fn`` over ``reps`` reps, rep i on the i-th run of ``n`` rows of ``rows``
    (wrapping around), after a warm-up."""
    starts = range(0, rows.shape[0] - n + 1, n)
    for s in list(starts)[:3]:
        fn(rows[s : s + n])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        s = starts[(i + 3) % len(starts)]
        x = rows[s : s + n]
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)  # the host queues the rep while this runs
        begin.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1e3)
    return statistics.median(times)


def _check(rows: torch.Tensor, n: int, **kw) -> None:
    for s in (0, rows.shape[0] - n):
        x = rows[s : s + n]
        got, want = greedy_argmax(x, **kw), x.argmax(dim=-1)
        assert torch.equal(got, want), (n, kw, (got != want).nonzero()[:4].tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,8,32,64,128,256", help="batch sizes (rows), at most 256")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--copies", type=int, default=8, help="buffers of [256, vocab] to read from")
    ap.add_argument("--sweep", action="store_true", help="also time other blocks and chunkings")
    args = ap.parse_args()
    ns = [int(v) for v in args.ns.split(",")]
    assert all(1 <= n <= ROWS for n in ns), ns
    dev = torch.device("cuda")
    rows = torch.randn(args.copies * ROWS, VOCAB, device=dev, dtype=torch.bfloat16)
    # Ties and NaN rows too, for the equality checks.
    rows[::7, 1000] = rows[::7, 90000] = 20.0
    rows[5::97, 4242] = float("nan")
    print(f"{torch.cuda.get_device_name()}, bf16 logits [n, {VOCAB}], median of {args.reps} "
          f"reps, each on rows no recent rep read; default block {BLOCK}, "
          f"{PROGRAMS_PER_SM} programs per SM")  # fmt: skip
    print("| n | programs | torch us | triton us | torch GB/s | triton GB/s | speedup |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in ns:
        _check(rows, n)
        nbytes = n * VOCAB * rows.element_size()
        chunks = -(-VOCAB // chunk_size(n, VOCAB, dev))
        t_torch = _median_us(lambda x: x.argmax(dim=-1), rows, n, args.reps)
        t_triton = _median_us(greedy_argmax, rows, n, args.reps)
        print(f"| {n} | {n * chunks} | {t_torch:.1f} | {t_triton:.1f} | "
              f"{nbytes / t_torch / 1e3:,.0f} | {nbytes / t_triton / 1e3:,.0f} | "
              f"{t_torch / t_triton:.2f} |")  # fmt: skip
    if not args.sweep:
        return
    print("\n| n | block | programs/SM | programs | triton us | GB/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in ns:
        nbytes = n * VOCAB * rows.element_size()
        best = None
        for block in (1024, 2048, 4096, 8192):
            for per_sm in (1, 2, 4, 8, 16):
                chunk = chunk_size(n, VOCAB, dev, block, per_sm)
                _check(rows, n, chunk=chunk, block=block)
                t = _median_us(
                    lambda x, c=chunk, b=block: greedy_argmax(x, chunk=c, block=b),
                    rows, n, args.reps,
                )  # fmt: skip
                programs = n * -(-VOCAB // chunk)
                print(f"| {n} | {block} | {per_sm} | {programs} | {t:.1f} | "
                      f"{nbytes / t / 1e3:,.0f} |")  # fmt: skip
                if best is None or t < best[0]:
                    best = (t, block, per_sm)
        assert best is not None
        print(f"| {n} | **best: {best[1]}** | **{best[2]}** | | **{best[0]:.1f}** | |")


if __name__ == "__main__":
    main()
