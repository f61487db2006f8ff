"""Compile the fused norm + projection kernels (engine_kernels/norm_linear.py, and the qkv one with
the q/k norm + rotary + KV store after it, engine_kernels/norm_qkv_rope_store.py) for sm_90 on
this machine (no GPU), with the default launch at each batch size, and report registers and
stack.

The first default launch (128 deep, 4 warps) took 255 registers and 16 bytes of stack for the
qkv projection at sm_90 (Triton 3.6): spills, in the kernel meant to save time. ``--check`` exits
1 if any default launch has stack (a CI test runs it: tests/kernels/test_norm_linear_sm90.py).

    python scripts/diag_norm_linear_sm90.py [--check]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine_kernels.norm_linear import (  # noqa: E402
    _norm_linear_kernel,
    norm_linear_config,
)
from engine_kernels.norm_qkv_rope_store import (  # noqa: E402
    _norm_qkv_rope_store_kernel,
    launch_for,
)
from scripts.diag_prefill_sm90 import resources  # noqa: E402

POINTERS = ["h_ptr", "res_ptr", "g_ptr", "w_ptr", "b_ptr", "out_ptr", "sum_ptr"]
INTS = ["M", "N", "K", "stride_h", "stride_res", "stride_w", "stride_out", "stride_sum"]
ROPE_POINTERS = {
    **dict.fromkeys(["h_ptr", "res_ptr", "g_ptr", "w_ptr", "b_ptr", "sum_ptr"], "*bf16"),
    "pos_ptr": "*i64", "cache_ptr": "*fp32", "slot_ptr": "*i64",
    **dict.fromkeys(["q_out_ptr", "k_cache_ptr", "v_cache_ptr", "q_norm_ptr", "k_norm_ptr"],
                    "*bf16"),
}  # fmt: skip
ROPE_INTS = [
    "M", "K", "stride_h", "stride_res", "stride_w", "stride_sum", "stride_cache", "stride_q_out",
    "stride_kc_blk", "stride_kc_tok", "stride_kc_h", "stride_vc_blk", "stride_vc_tok",
    "stride_vc_h", "n_heads", "n_kv_heads", "page_size",
]  # fmt: skip
BATCHES = (1, 16, 32, 64, 128, 256)


def _compile(kernel, signature: dict, constants: dict, num_warps: int, num_stages: int):
    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    # As a launch specialises them: 16-byte aligned pointers, strides and sizes divisible by 16.
    names = list(signature)
    aligned = [n for n in names if n.endswith("_ptr") or n.startswith("stride_") or n in ("N", "K")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(
        ASTSource(kernel, signature, constants, attrs),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )


def compile_default(rows: int, silu_gate: bool):
    """The kernel as the engine launches it in bf16 for ``rows`` rows of Qwen3-0.6B (K = 1024)."""
    cfg = norm_linear_config(rows, silu_gate)
    signature = {**dict.fromkeys(POINTERS, "*bf16"), **dict.fromkeys(INTS, "i32"), "eps": "fp32"}
    constants = {"HAS_RESIDUAL": True, "HAS_BIAS": False, "SILU_GATE": silu_gate,
                 "EVEN_K": True, "DOT_PRECISION": "tf32", "BLOCK_N": cfg.block_n,
                 "BLOCK_M": cfg.block_m, "BLOCK_K": cfg.block_k, "PDL": True}  # fmt: skip
    return cfg, _compile(_norm_linear_kernel, signature, constants, cfg.num_warps, cfg.num_stages)


def compile_rope(rows: int):
    """The qkv kernel with the attention's input side, as a decode step of Qwen3-0.6B launches
    it (head_dim 128, q/k norm)."""
    cfg = launch_for(rows, 128)
    signature = {**ROPE_POINTERS, **dict.fromkeys(ROPE_INTS, "i32"), "eps": "fp32",
                 "qk_eps": "fp32"}  # fmt: skip
    constants = {"HAS_RESIDUAL": True, "HAS_BIAS": False, "HAS_QK_NORM": True, "EVEN_K": True,
                 "DOT_PRECISION": "tf32", "HALF": cfg.block_n, "BLOCK_M": cfg.block_m,
                 "BLOCK_K": cfg.block_k, "PDL": True}  # fmt: skip
    launch = f"block_m={cfg.block_m}, num_warps={cfg.num_warps}"
    return launch, _compile(
        _norm_qkv_rope_store_kernel, signature, constants, cfg.num_warps, cfg.num_stages
    )


def main() -> None:
    check = "--check" in sys.argv[1:]
    print(f"triton {triton.__version__}, target sm_90")
    spilled = 0
    for silu_gate in (False, True):
        for rows in BATCHES:
            cfg, kernel = compile_default(rows, silu_gate)
            regs, stack = resources(kernel)
            spilled += stack > 0
            name = "gate/up + SiLU" if silu_gate else "qkv"
            print(f"{name}, {rows} rows, {cfg}: registers {regs}, stack {stack} B: "
                  f"{'ok' if stack == 0 else 'SPILLS'}")  # fmt: skip
    for rows in BATCHES:
        launch, kernel = compile_rope(rows)
        regs, stack = resources(kernel)
        spilled += stack > 0
        print(f"qkv + q/k norm, rotary, store, {rows} rows, {launch}: registers {regs}, "
              f"stack {stack} B: {'ok' if stack == 0 else 'SPILLS'}")  # fmt: skip
    if check and spilled:
        sys.exit(1)


if __name__ == "__main__":
    main()
