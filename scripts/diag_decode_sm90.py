"""Compile the planned decode attention kernel for sm_90 on this machine (no GPU), as the engine
launches it, and report registers and stack (spills).

The plan gives each multiprocessor four programs per KV head (``decode_split``), which fits at
4 warps only with at most 128 registers a thread.

    /tmp/t36/bin/python scripts/diag_decode_sm90.py [--check]

(the device's Triton, see scripts/diag_prefill_sm90.py). ``--check`` exits 1 unless it
compiled without stack at 128 registers or fewer (a CI test runs it:
tests/kernels/test_decode_sm90.py). Both ways the engine may launch it are compiled: from the
query (the default) and from the qkv rows (``FROM_QKV``: the query's norm and rotation and the
new key's store inside, ``ENGINE_KERNELS_DECODE_FROM_QKV=1``). The fused reduction (plan config
``fused``, not the default) takes more: it is compiled capped at 128 registers, its spills
reported but not checked.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine_kernels.decode_split import PLAN_UNIT  # noqa: E402
from engine_kernels.paged_attention_decode import (  # noqa: E402
    _decode_config,
    _decode_planned_kernel,
)
from scripts.diag_prefill_sm90 import resources  # noqa: E402

INTS = [
    "stride_qb", "stride_qh", "stride_ob", "stride_oh", "stride_k_blk", "stride_k_tok",
    "stride_k_h", "stride_v_blk", "stride_v_tok", "stride_v_h", "stride_bt", "num_heads",
    "num_kv_heads", "batch", "o_seq_start", "o_item_seq", "o_item_u0", "o_item_u1", "o_done",
]  # fmt: skip


def compile_planned(head_dim: int = 128, from_qkv: bool = False, fused: bool = False,
                    maxnreg: int | None = None):  # fmt: skip
    """The kernel as the engine launches it for Qwen3-0.6B's heads (q/k norm) in bf16 on CUDA
    (by default the reduction in its own launch, no register cap)."""
    launch = _decode_config(SimpleNamespace(is_cuda=True), planned=True)
    signature = {
        "q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16",
        "part_o_ptr": "*fp32", "part_lse_ptr": "*fp32", "bt_ptr": "*i32", "plan_ptr": "*i32",
        "scale_log2": "fp32", **dict.fromkeys(INTS, "i32"),
        "seq_lens_ptr": "*i32", "pos_ptr": "*i64", "cos_sin_ptr": "*fp32", "stride_cs": "i32",
        "slot_ptr": "*i64", "q_norm_ptr": "*bf16", "k_norm_ptr": "*bf16", "eps": "fp32",
    }  # fmt: skip
    constants = {"GROUP": 2, "BLOCK_G": 16, "PAGE": 16, "HEAD_DIM": head_dim,
                 "BLOCK_D": head_dim, "BLOCK_N": launch["block_n"], "UNIT": PLAN_UNIT,
                 "BLOCK_H": 16, "FUSED": fused, "DOT_PRECISION": "tf32", "PDL": True,
                 "FROM_QKV": from_qkv, "HAS_NORM": from_qkv, "BLOCK_GQ": 2}  # fmt: skip
    signature.update(dict.fromkeys(constants, "constexpr"))
    # As a launch specialises them: 16-byte aligned pointers, strides divisible by 16.
    names = list(signature)
    aligned = [n for n in names if n.endswith("_ptr") or n.startswith("stride_")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    return triton.compile(
        ASTSource(_decode_planned_kernel, signature, constants, attrs),
        target=GPUTarget("cuda", 90, 128),
        options={
            "num_warps": launch["num_warps"],
            "num_stages": launch["num_stages"],
            **({"maxnreg": maxnreg} if maxnreg else {}),
        },
    )


def main() -> None:
    check = "--check" in sys.argv[1:]
    print(f"triton {triton.__version__}, target sm_90")
    failed = False
    for name, from_qkv in (("planned decode", False), ("planned decode from qkv", True)):
        regs, stack = resources(compile_planned(from_qkv=from_qkv))
        ok = regs <= 128 and stack == 0
        failed |= not ok
        print(f"{name}, d128: registers {regs}, stack {stack} B: {'ok' if ok else 'WRONG'}")
    # Not checked: the plan config {"fused": 1, "maxnreg": 128}, a candidate that spills.
    for from_qkv in (False, True):
        regs, stack = resources(compile_planned(from_qkv=from_qkv, fused=True, maxnreg=128))
        print(f"fused reduction, maxnreg 128{', from qkv' if from_qkv else ''}, d128: "
              f"registers {regs}, stack {stack} B")  # fmt: skip
    if check and failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
