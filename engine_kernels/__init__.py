"""Kernels the reference engine calls: Triton on CUDA, the PyTorch references elsewhere.

``from engine_kernels import ops`` gives one function per kernel; each picks its implementation from
the device of its first tensor argument (see ``engine_kernels/ops.py``).
"""
