"""Decode steps replayed as CUDA graphs, one per batch size of a ladder.

A decode step of a small model is a few hundred short kernels; launching them one by one from
Python costs more than running them. Each graph is captured once over static input buffers;
a step copies its inputs into the buffers' first rows, pads the rest (slot -1: no cache write;
context length 1: a cheap dummy read) and replays the smallest graph that fits.
"""

from __future__ import annotations

import torch

from reference_engine.models import CausalLM, ForwardContext

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
        self.sizes = sorted({b for b in LADDER if b < max_batch} | {max_batch})
        self.input_ids = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.int64, device=dev)
        self.slot_mapping = torch.full((max_batch,), -1, dtype=torch.int64, device=dev)
        self.block_tables = torch.zeros(
            max_batch, max_blocks_per_seq, dtype=torch.int32, device=dev
        )
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for b in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
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
        )

    def fits(self, batch: int, table_width: int) -> bool:
        return batch <= self.sizes[-1] and table_width <= self.block_tables.shape[1]

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        n = input_ids.shape[0]
        b = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(slot_mapping)
        self.slot_mapping[n:b].fill_(-1)
        self.seq_lens[:n].copy_(seq_lens)
        self.seq_lens[n:b].fill_(1)
        self.block_tables[:n, : block_tables.shape[1]].copy_(block_tables)
        self.graphs[b].replay()
        return self.outputs[b][:n]
