"""Compile the TMA prefill kernel's candidate configurations for sm_90 on this machine (no GPU)
and report what each became: registers, stack (spills), shared memory, whether Triton's Hopper
warp specialisation took the loop, warps, wgmma count, setmaxnreg, and TMA copies into a buffer
of another shape than their box (the fault that hung the kernel on every GPU run). Run it with the
device's Triton (3.6) to read what the H100 / H200 will run:

    python3 -m venv /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0 torch==2.13.0 numpy
    /tmp/t36/bin/python scripts/diag_prefill_sm90.py

``--check`` compiles the defaults (CUDA_CONFIGS) only and exits 1 unless each compiled, each
specialised one was specialised, and no TMA copy fills a buffer of another shape (a CI test runs
it: tests/kernels/test_prefill_tma_sm90.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine_kernels.paged_attention_prefill_tma import (  # noqa: E402
    CANDIDATE_CONFIGS,
    CUDA_CONFIGS,
    _prefill_tma_kernel,
)

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


def compile_config(head_dim: int, cfg: dict):
    if cfg.get("gluon"):
        return compile_gluon(head_dim, cfg["block_m"], cfg["block_n"], cfg["gluon"] == 3)
    bm, bn = cfg["block_m"], cfg["block_n"]
    signature = {
        "q_ptr": "*bf16", "tokens": "i32", "stride_qt": "i32",
        "desc_k": f"tensordesc<bf16[{bn}, {head_dim}]>",
        "desc_v": f"tensordesc<bf16[{bn}, {head_dim}]>",
        "o_ptr": "*bf16", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "scale_log2": "fp32",
        "stride_ot": "i32", "stride_oh": "i32", "num_heads": "i32",
    }  # fmt: skip
    constants = {"GROUP": 2, "HEAD_DIM": head_dim, "BLOCK_M": bm, "BLOCK_N": bn,
                 "WARP_SPECIALIZE": bool(cfg["warp_specialize"]),
                 "PEEL_DIAGONAL": bool(cfg.get("peel", 0)),
                 "HEADS_FASTEST": bool(cfg.get("heads_fastest", 0))}  # fmt: skip
    signature.update(dict.fromkeys(constants, "constexpr"))
    kernel = triton.compile(
        ASTSource(_prefill_tma_kernel, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
                 **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {})},
    )  # fmt: skip
    return kernel


def compile_gluon(head_dim: int, block_m: int, block_n: int, pingpong: bool = False):
    """``paged_attention_prefill_gluon``'s kernel; its descriptors' types name their layouts."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from engine_kernels import paged_attention_prefill_gluon as glu

    def desc(rows: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.bfloat16)
        return f"tensordesc<bf16[{rows}, {head_dim}],{layout!r}>"

    signature = {
        "desc_q": desc(64), "desc_k": desc(block_n), "desc_v": desc(block_n),
        "o_ptr": "*bf16", "seq_lens_ptr": "*i32", "qsl_ptr": "*i32", "scale_log2": "fp32",
        "stride_ot": "i32", "stride_oh": "i32", "num_heads": "i32",
    }  # fmt: skip
    constants = {"GROUP": 2, "HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n,
                 "CONSUMER_REGS": glu.WS_CONSUMER_REGS[block_m // 64],
                 "PINGPONG": pingpong}  # fmt: skip
    signature.update(dict.fromkeys(constants, "constexpr"))
    return triton.compile(
        GluonASTSource(glu._prefill_gluon_ws_kernel, signature, constants),
        target=GPUTarget("cuda", 90, 128),
        options={"num_warps": 4},
    )


WGMMA_WAIT = re.compile(r"wgmma\.wait_group\.sync\.aligned (\d+)")


def resources(kernel) -> tuple[int, int]:
    """Registers per thread and bytes of stack (spills) of a compiled kernel, from its cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run(
            [CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True
        ).stdout
    regs, stack = (int(re.search(rf"{k}:(\d+)", usage).group(1)) for k in ("REG", "STACK"))
    return regs, stack


def report(kernel) -> str:
    regs, stack = resources(kernel)
    ptx = kernel.asm["ptx"]
    return (f"registers {regs}, stack {stack} B, shared {kernel.metadata.shared} B, "
            f"warp-specialised {'ttg.warp_specialize' in kernel.asm['ttgir']}, "
            f"warps {kernel.metadata.num_warps}, wgmma {ptx.count('wgmma.mma_async')}, "
            f"setmaxnreg {ptx.count('setmaxnreg')}, "
            f"wgmma waits {WGMMA_WAIT.findall(ptx)}, "
            f"TMA copies into a buffer of another shape "
            f"{box_mismatches(kernel.asm['ttgir'])}")  # fmt: skip


def box_mismatches(ttgir: str) -> int:
    """TMA copies whose descriptor box differs from the shared-memory buffer they fill: the
    copy writes the box while its barrier waits for the buffer's bytes, so the kernel hangs
    (2026-12-05: the query tile of a host descriptor, halved by the specialisation)."""
    copies = re.findall(
        r"async_tma_copy_global_to_local .*?tensordesc<tensor<([0-9x]+)x\w+.*?-> "
        r"!ttg\.memdesc<([0-9x]+)x\w+",
        ttgir,
    )
    return sum(box != buffer for box, buffer in copies)


def check(head_dim: int, cfg: dict) -> str | None:
    """What is wrong with this configuration compiled for sm_90, or None."""
    try:
        kernel = compile_config(head_dim, cfg)
    except Exception as e:  # noqa: BLE001 - a configuration the compiler refuses
        return f"does not compile: {type(e).__name__}: {str(e)[:200]}"
    ttgir = kernel.asm["ttgir"]
    if cfg["warp_specialize"] and "ttg.warp_specialize" not in ttgir:
        return "asked for warp specialisation, compiled without it"
    if mismatches := box_mismatches(ttgir):
        return f"{mismatches} TMA copies into a buffer of another shape than their box"
    return None


def main(argv: list[str]) -> int:
    print(f"triton {triton.__version__}, target sm_90")
    if "--check" in argv:
        faults = {d: check(d, cfg) for d, cfg in sorted(CUDA_CONFIGS.items())}
        for d, fault in faults.items():
            print(f"d{d} {CUDA_CONFIGS[d]}: {fault or 'ok'}", flush=True)
        return 1 if any(faults.values()) else 0
    for head_dim, configs in sorted(CANDIDATE_CONFIGS.items(), reverse=True):
        for cfg in configs:
            try:
                line = report(compile_config(head_dim, cfg))
            except Exception as e:  # noqa: BLE001 - a configuration the compiler refuses
                line = f"{type(e).__name__}: {str(e)[:120]}"
            print(f"d{head_dim} {cfg}: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
