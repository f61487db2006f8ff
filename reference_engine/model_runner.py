"""Runs one scheduled step on the model: lays the step's tokens out flat, writes their K/V into
the paged cache, computes logits only where a token is sampled, and samples."""

from __future__ import annotations

import numpy as np
import torch

from reference_engine.config import EngineConfig
from reference_engine.cuda_graphs import DecodeGraphs
from reference_engine.models import ForwardContext, load_model
from reference_engine.sampler import SampledTokens, Sampler
from reference_engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = config.device
        self.block_size = config.block_size
        torch.manual_seed(config.seed)
        self.model = load_model(
            config.model, config.device, config.dtype, config.load_format == "dummy"
        )
        self.model.init_rope(config.model.max_position_embeddings)
        self.num_blocks = self._num_kv_blocks()
        m = config.model
        shape = (self.num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        # Zeroed, not empty: stale NaNs in padding would leak through masked attention.
        self.kv_caches = [
            (
                torch.zeros(shape, dtype=config.dtype, device=self.device),
                torch.zeros(shape, dtype=config.dtype, device=self.device),
            )
            for _ in range(m.num_layers)
        ]
        self.sampler = Sampler(config.seed, self.device)
        self.graphs = None
        if self.device.type == "cuda" and not config.enforce_eager:
            max_blocks = -(-config.max_model_len // self.block_size)
            self.graphs = DecodeGraphs(self.model, self.kv_caches, config.max_num_seqs, max_blocks)

    def _bytes_per_block(self) -> int:
        m = self.config.model
        elem = torch.empty(0, dtype=self.config.dtype).element_size()
        return 2 * m.num_layers * self.block_size * m.num_kv_heads * m.head_dim * elem

    def _num_kv_blocks(self) -> int:
        if self.config.num_kv_blocks is not None:
            if self.config.num_kv_blocks < 1:
                raise ValueError("num_kv_blocks must be >= 1.")
            return self.config.num_kv_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            # Leave room for activations and logits of a full step beyond the utilisation cap.
            budget = free - (1 - self.config.gpu_memory_utilization) * total - (2 << 30)
        else:
            budget = self.config.kv_cache_memory_gb * (1 << 30)
        return max(int(budget // self._bytes_per_block()), 1)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> dict[str, SampledTokens]:
        """Returns the sampled tokens of every request that reached the end of its known tokens."""
        input_ids, positions, slots = [], [], []
        query_start_loc, seq_lens, tables = [0], [], []
        logits_rows, sampled_reqs = [], []
        bs = self.block_size
        for req in sched.requests:
            n = sched.num_scheduled_tokens[req.request_id]
            start = req.num_computed_tokens
            input_ids.extend(req.all_token_ids[start : start + n])
            if start + n > req.num_tokens:  # the step verifies drafts after the known tokens
                input_ids.extend(req.spec_token_ids[: start + n - req.num_tokens])
            blocks = sched.block_tables[req.request_id]
            positions.extend(range(start, start + n))
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, start + n))
            query_start_loc.append(query_start_loc[-1] + n)
            seq_lens.append(start + n)
            tables.append(blocks)
            if start + n >= req.num_tokens:  # the chunk reaches the last known token: sample
                first = query_start_loc[-1] - 1 - len(req.spec_token_ids)
                logits_rows.extend(range(first, query_start_loc[-1]))
                sampled_reqs.append(req)
        width = max(len(t) for t in tables)
        table = np.zeros((len(tables), width), dtype=np.int32)
        for row, t in zip(table, tables):
            row[: len(t)] = t  # numpy converts a list slice in C: far faster than nested lists
        is_decode = len(input_ids) == len(seq_lens)
        tensors = [
            _to_device(input_ids, torch.int64, self.device),
            _to_device(positions, torch.int64, self.device),
            _to_device(slots, torch.int64, self.device),
            _to_device(table, torch.int32, self.device),
            _to_device(seq_lens, torch.int32, self.device),
        ]
        if is_decode and self.graphs is not None and self.graphs.fits(len(seq_lens), width):
            hidden = self.graphs.run(*tensors)
        else:
            ids, pos, slot_mapping, block_tables, lens = tensors
            ctx = ForwardContext(
                slot_mapping=slot_mapping,
                block_tables=block_tables,
                seq_lens=lens,
                query_start_loc=_to_device(query_start_loc, torch.int32, self.device),
                is_decode=is_decode,
                max_query_len=max(b - a for a, b in zip(query_start_loc, query_start_loc[1:])),
                max_seq_len=max(seq_lens),
            )
            hidden = self.model(ids, pos, ctx, self.kv_caches)
        if not sampled_reqs:
            return {}
        if len(logits_rows) < hidden.shape[0]:
            hidden = hidden[_to_device(logits_rows, torch.int64, self.device)]
        logits = self.model.compute_logits(hidden)
        sampled = self.sampler(logits, sampled_reqs)
        return {req.request_id: s for req, s in zip(sampled_reqs, sampled)}


def _to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    cpu = (
        torch.from_numpy(values)
        if isinstance(values, np.ndarray)
        else torch.tensor(values, dtype=dtype)
    )
    if device.type == "cpu":
        return cpu
    # Pinned host memory makes the copy asynchronous: the one sync per step stays the sampling.
    return cpu.pin_memory().to(device, non_blocking=True)
