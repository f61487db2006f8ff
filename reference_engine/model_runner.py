"""Runs one scheduled step on the model: lays the step's tokens out flat, writes their K/V into
the paged cache, computes logits only where a token is sampled, and samples.

A step is launched (``launch``) and its sampled tokens read later (``collect``): between the
two the host is free. When every sampled request of a step is greedy without logprobs, the
tokens stay on the device (``argmax`` of the logits, the sampler's greedy rule), their copy to
pinned host memory is queued behind the step, and a following pure-decode step can be launched
from them before they are read (``launch_chained``: its input ids are gathered on the device).
Otherwise the step samples with the full ``Sampler`` at launch, which waits for the GPU.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from engine_kernels import ops
from engine_kernels.ops import new_kv_cache
from reference_engine.config import EngineConfig
from reference_engine.cuda_graphs import DecodeGraphs
from reference_engine.models import ForwardContext, load_model
from reference_engine.request import Request
from reference_engine.sampler import SampledTokens, Sampler
from reference_engine.scheduler import SchedulerOutput


@dataclass
class StepHandle:
    """A launched step. ``requests`` are the sampled requests in row order; either ``results``
    is known already (full sampler) or ``token_ids`` is on the device, copied to ``host``."""

    requests: list[Request]
    results: dict[str, SampledTokens] | None = None
    token_ids: torch.Tensor | None = None
    host: torch.Tensor | None = None
    event: torch.cuda.Event | None = None
    rows: dict[str, int] = field(default_factory=dict)


class _PinnedRing:
    """A few reusable pinned host buffers; one is reused only after the GPU work that read
    from (or wrote into) it last time has completed."""

    def __init__(self, make, size: int = 3):
        self.bufs = [make() for _ in range(size)]
        self.events: list[torch.cuda.Event | None] = [None] * size
        self.i = 0

    def take(self):
        self.i = (self.i + 1) % len(self.bufs)
        ev = self.events[self.i]
        if ev is not None:
            ev.synchronize()
        return self.i, self.bufs[self.i]

    def done(self, i: int, event: torch.cuda.Event) -> None:
        self.events[i] = event


class ModelRunner:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.device = config.device
        # A mixed step's one-token rows (decodes, a prompt's last token) go first and their
        # attention runs in the decode kernel (ForwardContext.num_decode_rows): on CUDA the
        # prefill kernel would give each of them a 128-row query tile, and its grid spans the
        # step's longest query for every row; in the throughput benchmark's ~20 mixed steps that
        # cost 0.36 s on an H100 (docs/performance.md, 2026-12-06). The CPU's reference
        # attention has no such tiles.
        self.split_one_token_rows = self.device.type == "cuda"
        self.host_wait_s = 0.0  # time the host spent waiting for the GPU to finish a step
        self.block_size = config.block_size
        torch.manual_seed(config.seed)
        self.model = load_model(
            config.model, config.device, config.dtype, config.load_format == "dummy"
        )
        self.model.init_rope(config.model.max_position_embeddings)
        self.num_blocks = self._num_kv_blocks()
        m = config.model
        shape = (self.num_blocks, self.block_size, m.num_kv_heads, m.head_dim)
        self.kv_caches = [
            (
                new_kv_cache(*shape, dtype=config.dtype, device=self.device),
                new_kv_cache(*shape, dtype=config.dtype, device=self.device),
            )
            for _ in range(m.num_layers)
        ]
        self.sampler = Sampler(config.seed, self.device)
        self.graphs = None
        self.max_blocks = -(-config.max_model_len // self.block_size)
        self._np_blocks: dict[str, tuple[list[int], np.ndarray]] = {}
        if self.device.type == "cuda":
            b, w = config.max_num_seqs, self.max_blocks
            plan_numel = 0
            if not config.enforce_eager:
                self.graphs = DecodeGraphs(self.model, self.kv_caches, b, w)
                plan_numel = self.graphs.plan.numel
            # Per decode step: ids, positions, slots (int64); seq_lens, table, plan (int32).
            self._stage = _PinnedRing(
                lambda: (
                    torch.empty(3 * b, dtype=torch.int64, pin_memory=True),
                    torch.empty(b + b * w + plan_numel, dtype=torch.int32, pin_memory=True),
                )
            )
            self._tokens = _PinnedRing(
                lambda: torch.empty(b * 8, dtype=torch.int64, pin_memory=True)
            )

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

    # --- the step ------------------------------------------------------------------------------

    def execute(self, sched: SchedulerOutput) -> dict[str, SampledTokens]:
        """Returns the sampled tokens of every request that reached the end of its known tokens."""
        return self.collect(self.launch(sched))

    @staticmethod
    def greedy_only(req: Request, tokens_ahead: int = 0) -> bool:
        """True when ``req``'s next token is the plain argmax of its logits (what the fast path
        computes); ``tokens_ahead``: tokens sampled but not yet appended to ``req``."""
        p = req.params
        return (
            p.greedy
            and p.logprobs is None
            and not req.spec_token_ids
            and req.num_output_tokens + tokens_ahead >= p.min_tokens
        )

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput) -> StepHandle:
        input_ids, starts, counts, tables = [], [], [], []
        logits_rows, sampled_reqs = [], []
        bs = self.block_size
        end = 0  # query_start_loc of the next request
        reqs = sched.requests
        if self.split_one_token_rows:  # one-token rows first (a stable sort)
            reqs = sorted(reqs, key=lambda r: sched.num_scheduled_tokens[r.request_id] != 1)
        num_scheduled, block_tables = sched.num_scheduled_tokens, sched.block_tables
        for req in reqs:
            rid = req.request_id
            n = num_scheduled[rid]
            start = req.num_computed_tokens
            stop = start + n
            known = req.all_token_ids
            input_ids += known[start:stop]
            if stop > len(known):  # the step verifies drafts after the known tokens
                input_ids += req.spec_token_ids[: stop - len(known)]
            starts.append(start)
            counts.append(n)
            tables.append(block_tables[rid])
            end += n
            if stop >= len(known):  # the chunk reaches the last known token: sample
                if req.spec_token_ids:
                    logits_rows.extend(range(end - 1 - len(req.spec_token_ids), end))
                else:
                    logits_rows.append(end - 1)
                sampled_reqs.append(req)
        table = _padded_table(tables)
        # Positions and KV slots of every token, in numpy: a long prompt chunk has thousands.
        n_arr = np.asarray(counts, dtype=np.int64)
        query_start_loc = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(n_arr, out=query_start_loc[1:])
        seq_lens = np.asarray(starts, dtype=np.int64) + n_arr
        rows = np.repeat(np.arange(len(counts)), n_arr)
        first_pos = seq_lens - query_start_loc[1:]  # each request's first position, less its row
        positions = np.arange(end, dtype=np.int64) + np.repeat(first_pos, n_arr)
        slots = table[rows, positions // bs].astype(np.int64) * bs + positions % bs
        is_decode = end == len(counts)
        if (
            is_decode
            and self.graphs is not None
            and self.graphs.fits(len(seq_lens), table.shape[1])
        ):
            ids = np.asarray(input_ids, dtype=np.int64)
            hidden = self._run_graph(ids, positions, slots, seq_lens, table)
        else:
            ones = int(np.argmax(n_arr != 1)) if self.split_one_token_rows and not is_decode else 0
            prefill_qsl = None  # the prefill kernel's query starts, when decode rows lead
            if ones:
                prefill_qsl = _to_device(
                    (query_start_loc[ones:] - ones).astype(np.int32), torch.int32, self.device
                )
            ctx = ForwardContext(
                slot_mapping=_to_device(slots, torch.int64, self.device),
                block_tables=_to_device(table, torch.int32, self.device),
                seq_lens=_to_device(seq_lens.astype(np.int32), torch.int32, self.device),
                query_start_loc=_to_device(
                    query_start_loc.astype(np.int32), torch.int32, self.device
                ),
                is_decode=is_decode,
                max_query_len=int(n_arr.max()),
                max_seq_len=int(seq_lens.max()),
                num_decode_rows=ones,
                prefill_query_start_loc=prefill_qsl,
                max_prefix_len=max(starts[ones:], default=0),
            )
            hidden = self.model(
                _to_device(input_ids, torch.int64, self.device),
                _to_device(positions, torch.int64, self.device),
                ctx,
                self.kv_caches,
            )
        if not sampled_reqs:
            return StepHandle([], results={})
        if len(logits_rows) < hidden.shape[0]:
            hidden = hidden[_to_device(logits_rows, torch.int64, self.device)]
        logits = self.model.compute_logits(hidden)
        if all(self.greedy_only(r) for r in sampled_reqs):
            return self._greedy(logits, sampled_reqs)
        sampled = self.sampler(logits.float(), sampled_reqs)
        return StepHandle(
            sampled_reqs, results={req.request_id: s for req, s in zip(sampled_reqs, sampled)}
        )

    @torch.inference_mode()
    def launch_chained(
        self, prev: StepHandle, requests: list[Request], positions: np.ndarray,
        block_tables: list[list[int]],
    ) -> StepHandle:  # fmt: skip
        """Launches a pure-decode step of ``requests`` (each sampled in ``prev``, not collected
        yet) at ``positions``: its input ids are ``prev``'s tokens, gathered on the device."""
        assert prev.token_ids is not None
        n = len(requests)
        rows = [prev.rows[r.request_id] for r in requests]
        if rows == list(range(n)):
            src = prev.token_ids[:n]
        else:
            src = prev.token_ids[_to_device(rows, torch.int64, self.device)]
        bs = self.block_size
        table_rows = self._table_rows(requests, block_tables)
        blocks = table_rows[np.arange(n), positions // bs].astype(np.int64)
        slots = blocks * bs + positions % bs
        if self.graphs is not None:
            self.graphs.input_ids[:n].copy_(src)
            hidden = self._run_graph(None, positions, slots, positions + 1, table_rows)
        else:  # eager (the CPU, or enforce_eager): same inputs, no graph
            ctx = ForwardContext(
                slot_mapping=_to_device(slots, torch.int64, self.device),
                block_tables=_to_device(table_rows, torch.int32, self.device),
                seq_lens=_to_device(positions + 1, torch.int32, self.device),
                query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=self.device),
                is_decode=True,
                max_seq_len=int(positions.max()) + 1,
            )
            pos = _to_device(positions, torch.int64, self.device)
            hidden = self.model(src, pos, ctx, self.kv_caches)
        logits = self.model.compute_logits(hidden)
        return self._greedy(logits, requests)

    def _table_rows(self, requests: list[Request], tables: list[list[int]]) -> np.ndarray:
        """``_padded_table(tables)`` for a chained decode step, from numpy copies of the tables
        kept between steps: a table only grows there, so a copy stays good while it is the same
        list (held, so that its id cannot pass to another) of the same length."""
        cache, fresh, rows = self._np_blocks, {}, []
        for req, t in zip(requests, tables):
            rid = req.request_id
            hit = cache.get(rid)
            if hit is None or hit[0] is not t or len(hit[1]) != len(t):
                hit = (t, np.asarray(t, dtype=np.int32))
            fresh[rid] = hit
            rows.append(hit[1])
        self._np_blocks = fresh
        lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
        return _rows_padded(np.concatenate(rows), lengths)

    def _run_graph(self, ids, positions, slots, seq_lens, table_rows) -> torch.Tensor:
        """Stages a decode step's inputs in pinned memory (one ring slot), plans the decode
        attention from ``seq_lens`` and replays the graph; nothing here waits for the GPU."""
        g = self.graphs
        n = len(seq_lens)
        width = table_rows.shape[1]
        slot, (i64, i32) = self._stage.take()
        a64, a32 = i64.numpy(), i32.numpy()
        if ids is not None:
            a64[:n] = ids
        a64[n : 2 * n] = positions
        a64[2 * n : 3 * n] = slots
        a32[:n] = seq_lens
        a32[n : n + n * width] = table_rows.reshape(-1)
        plan_at = n + n * width
        g.plan.fill(seq_lens, a32[plan_at : plan_at + g.plan.numel])
        hidden = g.run(
            None if ids is None else i64[:n],
            i64[n : 2 * n],
            i64[2 * n : 3 * n],
            i32[n : n + n * width].view(n, width),
            i32[:n],
            i32[plan_at : plan_at + g.plan.numel],
        )
        ev = torch.cuda.Event()
        ev.record()
        self._stage.done(slot, ev)
        return hidden

    def _greedy(self, logits: torch.Tensor, reqs: list[Request]) -> StepHandle:
        token_ids = ops.greedy_argmax(logits)  # the sampler's greedy rule, left on the device
        rows = {r.request_id: i for i, r in enumerate(reqs)}
        if self.device.type != "cuda":
            return StepHandle(reqs, token_ids=token_ids, host=token_ids, rows=rows)
        slot, host = self._tokens.take()
        n = len(reqs)
        host[:n].copy_(token_ids, non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        self._tokens.done(slot, ev)
        return StepHandle(reqs, token_ids=token_ids, host=host[:n], event=ev, rows=rows)

    def collect(self, handle: StepHandle) -> dict[str, SampledTokens]:
        """The step's sampled tokens by request id (waits for the step's GPU work)."""
        if handle.results is None:
            if handle.event is not None:
                start = time.perf_counter()
                handle.event.synchronize()
                self.host_wait_s += time.perf_counter() - start
            ids = handle.host.tolist()
            handle.results = {
                r.request_id: SampledTokens([t]) for r, t in zip(handle.requests, ids)
            }
        return handle.results


def _padded_table(tables: list[list[int]]) -> np.ndarray:
    """The block tables as one int32 array, each row zero-padded to the longest."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    blocks = itertools.chain.from_iterable(tables)
    return _rows_padded(np.fromiter(blocks, dtype=np.int32, count=int(lengths.sum())), lengths)


def _rows_padded(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``values``, rows of ``lengths`` laid end to end, as rows zero-padded to the longest."""
    out = np.zeros((len(lengths), int(lengths.max())), dtype=np.int32)
    out[np.arange(out.shape[1]) < lengths[:, None]] = values  # a mask is filled row by row
    return out


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
