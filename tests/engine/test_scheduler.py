"""Scheduler invariants on random workloads, driven without a model: every scheduled request
that reaches its last known token "samples" a fixed token."""

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.block_manager import KVCacheManager
from reference_engine.request import Request
from reference_engine.sampling_params import SamplingParams
from reference_engine.scheduler import Scheduler


@dataclass
class Config:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    speculative = None


def run(workload, num_blocks, block_size, max_num_seqs, budget, max_steps=5000):
    kv = KVCacheManager(num_blocks, block_size)
    sched = Scheduler(Config(max_num_seqs, budget), kv)
    reqs = [
        Request(
            str(i),
            None,
            [(i * 7 + j) % 50 for j in range(plen)],
            SamplingParams(max_tokens=out),
            eos_token_ids=[],
        )
        for i, (plen, out) in enumerate(workload)
    ]
    for r in reqs:
        sched.add_request(r)
    steps = 0
    while sched.has_unfinished_requests():
        steps += 1
        assert steps < max_steps, "no progress: a request starved"
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= budget
        assert len(out.requests) <= max_num_seqs
        assert len(sched.running) <= max_num_seqs
        used = {b for r in sched.running for b in kv.blocks_of(r.request_id)}
        assert len(used) == num_blocks - kv.num_free_blocks
        for r in out.requests:
            n = out.num_scheduled_tokens[r.request_id]
            assert n >= 1
            assert len(kv.blocks_of(r.request_id)) * block_size >= r.num_computed_tokens + n
            reaches_end = r.num_computed_tokens + n >= r.num_tokens
            sched.update_after_step(r, n, 0)
            if reaches_end:
                r.append_token(1)
                if r.num_output_tokens >= r.params.max_tokens:
                    sched.finish_request(r, "length")
    assert kv.num_free_blocks == num_blocks
    return reqs, sched


workloads = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    workload=workloads,
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(8, 64),
    block_size=st.sampled_from([1, 4, 16]),
)
def test_budget_slots_and_blocks_hold_and_everyone_finishes(
    workload, max_num_seqs, budget, block_size
):
    longest = max(p + o for p, o in workload)
    num_blocks = -(-longest // block_size) + 1  # tight: forces preemption under load
    reqs, _ = run(workload, num_blocks, block_size, max_num_seqs, budget)
    assert all(r.num_output_tokens == r.params.max_tokens for r in reqs)


def test_a_tight_pool_preempts_and_still_finishes_everything():
    reqs, sched = run([(6, 10)] * 6, num_blocks=8, block_size=4, max_num_seqs=6, budget=64)
    assert sched.num_preemptions > 0
    assert all(r.num_output_tokens == 10 for r in reqs)


def test_preemption_warns_on_the_first_and_every_fiftieth(caplog):
    """A pool too small for the load thrashes silently otherwise: the user is told, on the first
    preemption and then once per PREEMPTION_WARNING_EVERY, not on every one."""
    from reference_engine.scheduler import PREEMPTION_WARNING_EVERY

    with caplog.at_level("WARNING", logger="reference_engine.scheduler"):
        _, sched = run([(6, 40)] * 24, num_blocks=12, block_size=4, max_num_seqs=24, budget=64)
    warnings = [r for r in caplog.records if "preempted" in r.getMessage()]
    expected = -(-sched.num_preemptions // PREEMPTION_WARNING_EVERY)
    assert sched.num_preemptions > PREEMPTION_WARNING_EVERY, "the workload must thrash"
    assert len(warnings) == expected
    assert "12 blocks" in warnings[0].getMessage()


def test_long_prompts_are_chunked_under_the_budget():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(Config(4, 16), kv)
    req = Request("a", None, list(range(50)), SamplingParams(max_tokens=1), eos_token_ids=[])
    sched.add_request(req)
    chunks = []
    while req.num_computed_tokens < 50:
        out = sched.schedule()
        chunks.append(out.num_scheduled_tokens["a"])
        sched.update_after_step(req, chunks[-1], 0)
    assert chunks == [16, 16, 16, 2]


def test_fcfs_admission_order():
    kv = KVCacheManager(64, 4)
    sched = Scheduler(Config(2, 1000), kv)
    for i in range(4):
        sched.add_request(Request(str(i), None, [i] * 5, SamplingParams(), eos_token_ids=[]))
    assert [r.request_id for r in sched.schedule().requests] == ["0", "1"]


def test_abort_frees_blocks_at_once():
    kv = KVCacheManager(16, 4)
    sched = Scheduler(Config(4, 100), kv)
    sched.add_request(Request("a", None, list(range(10)), SamplingParams(), eos_token_ids=[]))
    sched.schedule()
    assert kv.num_free_blocks < 16
    assert [r.request_id for r in sched.abort_requests(["a", "unknown"])] == ["a"]
    assert kv.num_free_blocks == 16 and not sched.has_unfinished_requests()
