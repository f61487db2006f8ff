"""A paged decode attention for the CPU in C++, opt-in (``ENGINE_KERNELS_CPU_DECODE=1``).

The PyTorch path (``reference.paged_attention_decode``) gathers every sequence's context into a
padded tensor and runs two batched matmuls per KV head: on this project's 2-core machine the
matmuls read the contexts at about half of the memory's stream rate, and the whole decode
attention took 2.0 s of a 4.4 s run (docs/performance.md, 2026-12-08, CPU). This kernel reads
the paged cache in place, once: for each sequence and KV head, block by block, the scores of the
group's query heads, an online softmax and the weighted value rows; threads share the
(sequence, KV head) pairs. It is compiled on first use with ``torch.utils.cpp_extension``
(a C++ compiler and ``ninja`` are needed; without them ``available()`` is False and the
PyTorch path runs), for the machine it runs on (``-march=native``) and with fast math, whose
vectorized ``exp`` it needs (so it keeps its running maxima finite, and does not promise NaN
propagation). The PyTorch path stays its oracle (tests/kernels/test_cpu_decode.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from typing import Any

import torch

OPT_IN = "ENGINE_KERNELS_CPU_DECODE"

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// One (sequence, KV head): its group's query heads over the sequence's blocks, in place.
// DIM > 0 fixes the head dim at compile time (the loops unroll); 0 takes it at run time.
template <int DIM>
static void attend(const float* qh, float* oh, const float* kp, const float* vp,
                   const int32_t* table, int64_t n, int64_t group, int64_t dim_rt,
                   int64_t block_size, int64_t k_block, int64_t k_row, int64_t v_block,
                   int64_t v_row, float scale, float* scores, float* acc, float* top,
                   float* sum) {
  const int64_t dim = DIM > 0 ? DIM : dim_rt;
  std::fill(acc, acc + group * dim, 0.0f);
  std::fill(top, top + group, -std::numeric_limits<float>::max());  // finite: fast math
  std::fill(sum, sum + group, 0.0f);
  for (int64_t j = 0; j * block_size < n; ++j) {
    const int64_t block = table[j];
    const int64_t rows = std::min(block_size, n - j * block_size);
    const float* kb = kp + block * k_block;
    const float* vb = vp + block * v_block;
    for (int64_t t = 0; t < rows; ++t) {  // each key row once, for every query head
      const float* __restrict kt = kb + t * k_row;
      for (int64_t g = 0; g < group; ++g) {
        const float* __restrict qg = qh + g * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < dim; ++d) dot += qg[d] * kt[d];
        scores[g * block_size + t] = dot * scale;
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      float* __restrict sg = scores + g * block_size;
      float block_top = -std::numeric_limits<float>::max();
#pragma omp simd reduction(max : block_top)
      for (int64_t t = 0; t < rows; ++t) block_top = std::max(block_top, sg[t]);
      const float new_top = std::max(top[g], block_top);
      const float rescale = std::exp(top[g] - new_top);  // 0 before the first block
      float block_sum = 0.0f;
#pragma omp simd reduction(+ : block_sum)
      for (int64_t t = 0; t < rows; ++t) {
        sg[t] = std::exp(sg[t] - new_top);
        block_sum += sg[t];
      }
      sum[g] = sum[g] * rescale + block_sum;
      top[g] = new_top;
      float* __restrict ag = acc + g * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) ag[d] *= rescale;
    }
    for (int64_t t = 0; t < rows; ++t) {  // each value row once, for every query head
      const float* __restrict vt = vb + t * v_row;
      for (int64_t g = 0; g < group; ++g) {
        const float p = scores[g * block_size + t];
        float* __restrict ag = acc + g * dim;
#pragma omp simd
        for (int64_t d = 0; d < dim; ++d) ag[d] += p * vt[d];
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float inv = 1.0f / sum[g];
    for (int64_t d = 0; d < dim; ++d) oh[g * dim + d] = acc[g * dim + d] * inv;
  }
}

// q [B, H, D] contiguous fp32; caches [blocks, block_size, KVH, D] fp32 with unit stride in D;
// block_tables [B, W] int32; seq_lens [B] int32. A row with no context gets zeros.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = heads / kv_heads;
  auto out = torch::zeros_like(q);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t k_block = k_cache.stride(0), k_row = k_cache.stride(1), k_head = k_cache.stride(2);
  const int64_t v_block = v_cache.stride(0), v_row = v_cache.stride(1), v_head = v_cache.stride(2);
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int64_t width = block_tables.stride(0);
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * block_size), acc(group * dim), top(group), sum(group);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, h = item % kv_heads;
      if (lens[b] <= 0) continue;
      const int64_t first = (b * heads + h * group) * dim;
      auto run = [&](auto fixed) {
        attend<decltype(fixed)::value>(
            qp + first, op + first, kp + h * k_head, vp + h * v_head, tables + b * width,
            lens[b], group, dim, block_size, k_block, k_row, v_block, v_row, s,
            scores.data(), acc.data(), top.data(), sum.data());
      };
      if (dim == 64) run(std::integral_constant<int, 64>());
      else if (dim == 128) run(std::integral_constant<int, 128>());
      else run(std::integral_constant<int, 0>());
    }
  });
  return out;
}
"""


@functools.cache
def _module() -> Any | None:
    """The compiled kernel, or None where it cannot be built (no compiler, no ninja)."""
    bin_dir = os.path.dirname(sys.executable)  # where pip's ninja lands, unactivated
    if shutil.which("ninja") is None and shutil.which("ninja", path=bin_dir):
        os.environ["PATH"] = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    try:
        from torch.utils.cpp_extension import load_inline

        return load_inline(
            "engine_kernels_cpu_decode",
            cpp_sources=[_SOURCE],
            functions=["paged_decode"],
            extra_cflags=["-O3", "-march=native", "-fopenmp", "-ffast-math"],
            extra_ldflags=["-fopenmp", "-lmvec"],
        )
    except Exception:  # noqa: BLE001 - any build failure means: use the PyTorch path
        return None


def available() -> bool:
    return _module() is not None


def enabled() -> bool:
    return os.environ.get(OPT_IN, "0") == "1"


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """fp32 on the CPU, head dims of unit stride, query heads a multiple of the KV heads."""
    return (
        q.device.type == "cpu"
        and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32
        and k_cache.stride(3) == 1
        and v_cache.stride(3) == 1
        and q.shape[1] % k_cache.shape[2] == 0
    )


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """``reference.paged_attention_decode``'s contract, in one pass over the cache in place."""
    module = _module()
    if module is None:
        raise RuntimeError("the CPU decode kernel could not be built (a C++ compiler and ninja)")
    return module.paged_decode(
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables.to(torch.int32).contiguous(),
        seq_lens.to(torch.int32).contiguous(),
        float(scale),
    )
