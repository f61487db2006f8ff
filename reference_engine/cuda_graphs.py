"""Decode steps replayed as CUDA graphs, one per batch size of a ladder.

A decode step of a small model is a few hundred short kernels; launching them one by one from
Python costs more than running them. Each graph is captured once over static input buffers;
a step copies its inputs into the buffers' first rows, pads the rest (slot -1: no cache write;
context length 1: a cheap dummy read) and replays the smallest graph that fits.

The decode attention runs on a ``DecodePlan``: a fixed grid whose work is cut on the host, each
step, from the live context lengths (see ``engine_kernels/decode_split.py``), so a graph
captured once serves short and long contexts alike at full width.
"""

from __future__ import annotations

import json
import os

import torch

from engine_kernels.decode_split import DecodePlan, plan_workspace_numel
from reference_engine.models import CausalLM, ForwardContext

# REFERENCE_ENGINE_DECODE_PLAN=0 (for comparisons): the split decode sized from the block
# table's capacity instead of a DecodePlan.
USE_PLAN = os.environ.get("REFERENCE_ENGINE_DECODE_PLAN", "1") == "1"
# For comparisons: the planned kernel's launch options ({"fused": 0, "num_stages": 3, ...}), its
# programs per multiprocessor ("per_sm") and chunks a KV head left out ("spare"), instead of the
# defaults.
PLAN_CONFIG = json.loads(os.environ.get("REFERENCE_ENGINE_DECODE_CONFIG", "{}"))
LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)


class DecodeGraphs:
    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        max_batch: int,
        max_blocks_per_seq: int,
    ):
        dev = model.embed_tokens.weight.device
        cfg = model.config
        self.sizes = sorted({b for b in LADDER if b < max_batch} | {max_batch})
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(
            max_batch, max_blocks_per_seq, dtype=torch.int32, device=dev
        )
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.plan = DecodePlan.from_config(max_batch, cfg.num_kv_heads, dev, PLAN_CONFIG)
        self.workspace = torch.empty(
            plan_workspace_numel(self.plan.max_items, cfg.num_heads, cfg.head_dim),
            dtype=torch.float32,
            device=dev,
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for b in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
            # A plan names sequences by row: one filled for a larger batch would read rows past
            # this size's inputs (out of bounds of q) during warm-up.
            self.plan.fill([1] * b)
            self.plan.device.copy_(self.plan.host)
            ctx = self._context(b)
            args = (self.input_ids[:b], self.positions[:b], ctx, kv_caches)
            for _ in range(2):  # compiles Triton kernels and settles the allocator before capture
                model(*args)
            torch.cuda.synchronize(dev)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[b] = model(*args)
            pool = graph.pool()
            self.graphs[b] = graph
        torch.cuda.synchronize(dev)

    def _context(self, b: int) -> ForwardContext:
        return ForwardContext(
            slot_mapping=self.slot_mapping[:b],
            block_tables=self.block_tables[:b],
            seq_lens=self.seq_lens[:b],
            query_start_loc=self.query_start_loc[: b + 1],
            is_decode=True,
            decode_plan=self.plan if USE_PLAN else None,
            decode_workspace=self.workspace if USE_PLAN else None,
        )

    def fits(self, batch: int, table_width: int) -> bool:
        return batch <= self.sizes[-1] and table_width <= self.block_tables.shape[1]

    def run(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        plan: torch.Tensor,
    ) -> torch.Tensor:
        """Copies a step's inputs (host tensors in pinned memory, or device tensors; the copies
        do not sync) and replays. ``plan``: the step's ``DecodePlan`` buffer, filled on the host
        for ``seq_lens``. ``input_ids`` None: the caller has written ``self.input_ids[:n]``."""
        n = positions.shape[0]
        b = next(s for s in self.sizes if s >= n)
        if input_ids is not None:
            self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        if b > n:
            self.slot_mapping[n:b].fill_(-1)
            self.seq_lens[n:b].fill_(1)
        self.block_tables[:n, : block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        self.plan.device.copy_(plan, non_blocking=True)
        self.graphs[b].replay()
        return self.outputs[b][:n]
