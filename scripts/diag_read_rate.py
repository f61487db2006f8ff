"""Is the copy rate the ceiling of a kernel that only reads?

The bandwidth floor of docs/performance.md is taken at the rate of a device-to-device copy
(bytes read + written per second), and the decode attention reads the KV cache at 94% of it.
A kernel that only reads may go faster than a copy (no write-backs sharing the bus): if it does,
the attention has more headroom than 6%. This times, on one 4 GiB buffer:

- ``copy``: ``dst.copy_(src)``, read + written bytes (benchmarks.gpu_throughput's figure);
- ``torch sum``: ``src.sum()``, read bytes;
- ``triton read, B x W``: a Triton kernel that sums its slice of the buffer in tiles of B
  elements with W warps, each program one slice, read bytes (a row per launch shape).

    python scripts/diag_read_rate.py
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.testing

GIB = 1 << 30


@triton.jit
def _read_kernel(x_ptr, out_ptr, per_program, BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * per_program
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, per_program, BLOCK):
        acc += tl.load(x_ptr + start + i + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def rate(fn, nbytes: int) -> float:
    """TB/s of ``nbytes`` moved per call (median of triton.testing.do_bench)."""
    return nbytes / triton.testing.do_bench(fn, warmup=50, rep=500) / 1e9


def main() -> None:
    src = torch.randn(2 * GIB, dtype=torch.bfloat16, device="cuda")  # 4 GiB
    nbytes = src.numel() * src.element_size()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(torch.cuda.get_device_name(0))
    dst = torch.empty_like(src)
    print(f"copy: {rate(lambda: dst.copy_(src), 2 * nbytes):.3f} TB/s (read + written)")
    dst = None  # frees the 4 GiB before the reads
    print(f"torch sum: {rate(lambda: src.sum(), nbytes):.3f} TB/s (read)")
    for block, warps, per_sm in ((4096, 4, 4), (8192, 8, 4), (8192, 8, 8), (16384, 16, 2),
                                 (4096, 4, 16), (2048, 4, 32)):  # fmt: skip
        programs = sms * per_sm
        per_program = src.numel() // programs // block * block
        out = torch.empty(programs, device="cuda")

        def run(programs=programs, per_program=per_program, out=out, block=block, warps=warps):
            _read_kernel[(programs,)](src, out, per_program, BLOCK=block, num_warps=warps)

        got = rate(run, programs * per_program * src.element_size())
        print(f"triton read, {block} x {warps} warps, {per_sm} programs/SM: {got:.3f} TB/s")


if __name__ == "__main__":
    main()
