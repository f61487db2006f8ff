"""The one continuous-batching scheduler behind every front end.

Each step gets a token budget. Running requests go first, oldest first, each taking what it
still has to compute (a decode token plus any drafts, or the next chunk of a long prompt); then
waiting requests are admitted in arrival order while budget, batch slots and KV blocks last.
When a running request cannot get a block, the newest running request is preempted: its blocks
are freed and it goes back to the front of the queue to be recomputed later (FCFS, so the oldest
request always progresses and none starves).
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from reference_engine.block_manager import KVCacheManager
from reference_engine.config import EngineConfig
from reference_engine.request import Request, RequestStatus
from reference_engine.spec_decode import NgramProposer

logger = logging.getLogger(__name__)
# A pool too small for the load makes the engine recompute evicted requests over and over (a
# 1,023-step workload took 27,377 steps on a pool another engine had half taken): say so, on the
# first preemption and on every PREEMPTION_WARNING_EVERY-th after it.
PREEMPTION_WARNING_EVERY = 50


@dataclass
class SchedulerOutput:
    requests: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # drafts included
    preempted: list[Request] = field(default_factory=list)
    block_tables: dict[str, list[int]] = field(default_factory=dict)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    @property
    def is_empty(self) -> bool:
        return not self.requests


class Scheduler:
    def __init__(self, config: EngineConfig, kv_cache: KVCacheManager):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_model_len = config.max_model_len
        self.chunked_prefill = config.enable_chunked_prefill
        self.kv_cache = kv_cache
        self.proposer = NgramProposer(config.speculative) if config.speculative else None
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    def add_request(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"Request id {req.request_id!r} is already active.")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def schedule(
        self,
        in_flight: SchedulerOutput | None = None,
        decodes_ahead: Callable[[Request], bool] | None = None,
    ) -> SchedulerOutput:
        """The next step. ``in_flight``: a step launched but whose sampled tokens are not yet
        appended (overlapped scheduling); the step after it is then decided ahead of them (see
        ``_schedule_ahead``), and an empty output means it has to wait for them."""
        if in_flight is not None:
            return self._schedule_ahead(in_flight, decodes_ahead or (lambda req: False))
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        running, proposer = self.running, self.proposer
        allocate, scheduled = self.kv_cache.allocate_slots, out.num_scheduled_tokens
        while i < len(running) and budget > 0:
            req = running[i]
            if proposer is not None:
                self._propose_drafts(req)
            elif req.spec_token_ids:
                req.spec_token_ids = []
            n = min(req.num_tokens - req.num_computed_tokens + len(req.spec_token_ids), budget)
            while not allocate(req, n):
                victim = running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                if req.spec_token_ids:
                    self._trim_drafts(req, n)
                out.requests.append(req)
                scheduled[req.request_id] = n
                budget -= n
                i += 1

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if out.preempted:
                break  # the pool is full: admitting more now would only thrash
            req = self.waiting[0]
            hits = self.kv_cache.get_computed_blocks(req)
            num_hit = len(hits) * self.kv_cache.block_size
            n = req.num_tokens - num_hit
            if n > budget:
                if not self.chunked_prefill:
                    break
                n = budget
            if not self.kv_cache.allocate_slots(req, n, hits):
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens = num_hit
            if req.num_cached_tokens < 0:
                req.num_cached_tokens = num_hit
            self.running.append(req)
            out.requests.append(req)
            out.num_scheduled_tokens[req.request_id] = n
            budget -= n
        blocks_of = self.kv_cache.blocks_of
        out.block_tables = {rid: blocks_of(rid) for rid in scheduled}
        return out

    def _schedule_ahead(
        self, in_flight: SchedulerOutput, decodes_ahead: Callable[[Request], bool]
    ) -> SchedulerOutput:
        """The decode step after ``in_flight``, for the requests that keep running whatever token
        they sample there: each takes one token at the position after its in-flight one. This is
        what ``schedule`` would do once the tokens are appended, as long as nothing waits for
        admission, every request of ``in_flight`` samples its token where the next step can read
        it (``decodes_ahead``: the runner's rule, e.g. greedy on the device) and blocks suffice;
        otherwise the output is empty. A request that then stops at ``in_flight`` (EOS, a stop
        token, an abort) is dropped from this step by the engine."""
        out = SchedulerOutput()
        if self.proposer is not None or (self.waiting and len(self.running) < self.max_num_seqs):
            return out
        max_model_len, in_flight_tokens = self.max_model_len, in_flight.num_scheduled_tokens
        allocate, blocks_of = self.kv_cache.allocate_slots, self.kv_cache.blocks_of
        for req in in_flight.requests:
            if req.is_finished:
                continue
            rid = req.request_id
            n = in_flight_tokens[rid]
            if req.num_computed_tokens + n < req.num_tokens:
                return SchedulerOutput()  # a prompt chunk: nothing sampled in flight
            if req.tokens_left(max_model_len) <= 1:
                continue  # stops at the in-flight step for sure
            if not decodes_ahead(req):
                return SchedulerOutput()  # a token the host must sample first
            if not allocate(req, n + 1):
                return SchedulerOutput()  # short of blocks: ``schedule`` preempts
            out.requests.append(req)
            out.num_scheduled_tokens[rid] = 1
            out.block_tables[rid] = blocks_of(rid)
        return out

    def _propose_drafts(self, req: Request) -> None:
        req.spec_token_ids = []
        if self.proposer is None or req.num_tokens - req.num_computed_tokens != 1:
            return
        # Never draft past max_tokens or the model length: those tokens could not be kept.
        room = req.tokens_left(self.max_model_len) - 1
        if room > 0:
            req.spec_token_ids = self.proposer.propose(req.all_token_ids)[:room]

    @staticmethod
    def _trim_drafts(req: Request, num_scheduled: int) -> None:
        keep = num_scheduled - (req.num_tokens - req.num_computed_tokens)
        del req.spec_token_ids[max(keep, 0) :]

    def _preempt(self, req: Request) -> None:
        self.kv_cache.free_request(req)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.spec_token_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)
        if self.num_preemptions % PREEMPTION_WARNING_EVERY == 1:
            logger.warning(
                "Request %s was preempted: the KV cache (%d blocks) cannot hold the running "
                "requests, so it will be recomputed, which costs throughput (%d preemptions so "
                "far). Give the cache more memory (gpu_memory_utilization, num_kv_blocks) or "
                "lower max_num_seqs.",
                req.request_id, self.kv_cache.num_blocks, self.num_preemptions,
            )  # fmt: skip

    def update_after_step(self, req: Request, num_scheduled: int, num_accepted_drafts: int) -> None:
        """Advances ``req`` once the model has run its ``num_scheduled`` tokens; drafts past
        ``num_accepted_drafts`` were rejected and their blocks are released."""
        num_drafts = len(req.spec_token_ids)
        req.num_computed_tokens += num_scheduled - num_drafts + num_accepted_drafts
        if num_drafts:
            req.spec_token_ids = []
            if num_drafts > num_accepted_drafts:
                self.kv_cache.trim(req, req.num_tokens)
        self.kv_cache.cache_full_blocks(req)

    def finish_request(
        self, req: Request, reason: str, stop_reason: int | str | None = None
    ) -> None:
        if req.is_finished:
            return
        req.status = RequestStatus.FINISHED
        req.finish_reason, req.stop_reason = reason, stop_reason
        self.requests.pop(req.request_id, None)
        if req in self.running:
            self.running.remove(req)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(req)
        self.kv_cache.free_request(req)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        aborted = []
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None:
                self.finish_request(req, "abort")
                aborted.append(req)
        return aborted
