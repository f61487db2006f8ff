"""The waste verdict's arithmetic, on made-up records and `/metrics` samples."""

from __future__ import annotations

import pytest

from loadtests.prom import Snapshot, parse
from loadtests.waste import (
    Waste,
    aborts_line,
    credit,
    first_token_delay,
    interpolate,
    measure,
    windows,
)


def snap(t: float, gen: float | None, steps: float | None = None, aborts: float | None = None):
    return Snapshot(t, 0, 0, 0.0, gen, None, steps, aborts)


def event(kind="after-chunks", outcome="disconnect", start=0.0, duration=1.0, tokens=3, **kw):
    e = dict(
        kind=kind,
        outcome=outcome,
        start=start,
        duration=duration,
        tokens=tokens,
        stream=True,
        exact=True,
        max_tokens=1000,
        ttft=0.1,
        chunks=2,
        stopped=False,
    )
    return {**e, **kw}


def test_parse_reads_steps_and_aborts_by_reason():
    m = parse(
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 5.0\n'
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 2.0\n'
        'vllm:request_success_total{engine="1",finished_reason="abort",model_name="m"} 1.0\n'
        'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 40.0\n'
    )
    assert m['vllm:request_success_total{finished_reason="abort"}'] == 6.0
    assert m["vllm:request_success_total"] == 8.0
    assert m["vllm:iteration_tokens_total_count"] == 40.0


def test_interpolate_between_samples_and_clamps_outside():
    s = [snap(0, 0, steps=0), snap(10, 100, steps=50), snap(20, None, steps=None)]
    assert interpolate(s, "steps", 5) == 25
    assert interpolate(s, "gen_tokens", -1) == 0
    assert interpolate(s, "gen_tokens", 30) == 100
    assert interpolate([snap(0, None)], "steps", 1) is None


def test_non_streaming_client_that_gave_up_is_credited_one_token_per_step():
    s = [snap(0, 0, steps=0), snap(10, 0, steps=100)]
    waited = event(kind="client-timeout", stream=False, start=2.0, duration=0.5, tokens=None)
    assert credit(waited, s) == pytest.approx(5.0)  # 5 steps while it was connected
    assert credit({**waited, "max_tokens": 3}, s) == 3  # never more than it asked for
    assert credit(event(start=2.0, duration=0.5), s) == 0  # a stream counts what it received
    assert credit({**waited, "outcome": "complete"}, s) == 0
    assert credit(waited, [snap(0, 0), snap(10, 0)]) == 0  # no step counter: no credit
    # From its earliest possible first token: the shortest TTFT of the streams near it.
    streams = [event(start=2.0, ttft=t) for t in (0.2, 0.3, 0.4)] + [event(start=7.0, ttft=3.0)]
    delay = first_token_delay(streams)
    assert delay(2.3) == 0.2 and delay(7.5) == 3.0 and delay(12.0) == 0.2
    assert credit(waited, s, delay) == pytest.approx(3.0)  # steps 22 to 25


def test_waste_is_generated_minus_received_minus_credited():
    events = [
        event(outcome="complete", tokens=50),
        event(tokens=4),  # hung up after 4 tokens
        event(kind="first-byte", tokens=None, exact=False),
        # Credited from the streams' shortest TTFT (0.1 s) on: 10 steps of 100 a second.
        event(kind="client-timeout", stream=False, start=0.0, duration=0.2, tokens=None),
    ]
    before, after = snap(0, 1000, steps=0, aborts=7), snap(1, 1080, steps=100, aborts=10)
    w = measure(events, [], before, after, bound_steps=8, idle_after=True)
    assert w.generated == 80 and w.received == 54 and w.credited == pytest.approx(10)
    assert w.tokens == pytest.approx(16) and w.disconnects == 3
    assert w.per_disconnect == pytest.approx(16 / 3)
    assert w.share == pytest.approx(0.2)
    assert w.bound_tokens == 24 and w.ok is True
    assert w.aborts_counted == 3 and w.steps == 100
    assert w.verdict().startswith("waste: ") and "within the bound" in w.verdict()


def test_above_the_bound_is_a_waste_line():
    events = [event(tokens=2) for _ in range(10)]
    w = measure(events, [], snap(0, 0), snap(1, 20 + 10 * 40), bound_steps=8, idle_after=False)
    assert w.tokens == 400 and w.ok is False
    line = w.verdict()
    assert line.startswith("WASTE: at least 400 tokens") and "40.0 per disconnect" in line
    assert "8 engine steps per disconnect" in line


def test_without_a_generation_counter_nothing_is_judged():
    w = measure([event()], [], snap(0, None), snap(1, None), bound_steps=8, idle_after=True)
    assert w.tokens is None and w.ok is None and "not measured" in w.verdict()


def test_aborts_side_by_side_with_the_uncounted_abort_deviation():
    def waste(aborts: float | None, ok: bool = True) -> Waste:
        extra = 0 if ok else 1000
        events = [event(tokens=1) for _ in range(5)]
        return measure(events, [], snap(0, 0, aborts=0), snap(1, 5 + extra, aborts=aborts), 8, True)

    assert aborts_line(waste(5)) == "aborts: 5 counted by the server, 5 disconnects made"
    assert "vllm#31503" in aborts_line(waste(0)) and "not a failure" in aborts_line(waste(0))
    assert "did not abort" in aborts_line(waste(0, ok=False))
    assert "nothing to abort" in aborts_line(waste(3))
    assert "no request_success_total" in aborts_line(waste(None))


def test_windows_sum_to_the_total():
    events = [
        event(outcome="complete", start=1.0, duration=4.0, tokens=40),
        event(start=6.0, duration=1.0, tokens=5),
    ]
    samples = [snap(0, 0), snap(5, 40), snap(10, 60)]
    rows = windows(events, samples, 0.0, 10.0, width=5.0)
    assert [r.start for r in rows] == [0.0, 5.0]
    assert sum(r.generated for r in rows) == 60
    assert sum(r.received for r in rows) == pytest.approx(45)
    assert sum(r.waste for r in rows) == pytest.approx(15)
    assert [r.disconnects for r in rows] == [0, 1]


def test_probe_counts_steps_from_the_hang_up_not_from_the_poll_before_it():
    from loadtests.probe import _after

    def poll(t: float, steps: float, running: float) -> Snapshot:
        return Snapshot(t, running, 0, 0.0, None, None, steps, None)

    # 4 streams running; the hang-up at t=1.5 lies halfway between two polls 10 steps apart.
    polls = [poll(1.0, 100, 4), poll(2.0, 110, 4), poll(2.5, 115, 4), poll(3.0, 117, 0)]
    steps, request_steps = _after(polls, 1.5, idle_running=0)
    assert steps == 12  # from step 105 to 117
    assert request_steps == 4 * 5 + 4 * 5 + 2 * 2  # the last interval: running fell in it


def test_tail_bounds_what_is_decoded_after_the_last_client_left():
    from loadtests.tail import Tail

    def at(running: float, gen: float, steps: float) -> Snapshot:
        return Snapshot(0, running, 0, 0.0, gen, None, steps, None)

    idle = at(0, 0, 0)
    healthy = Tail(at(3, 100, 50), idle, 8, [at(0, 103, 51)])
    assert healthy.fell and healthy.tokens == 3 and healthy.bound_tokens == 24 and healthy.ok
    never = Tail(at(3, 100, 50), idle, 8, [at(3, 300, 117)])
    assert not never.fell and never.steps == 67 and never.ok is False
    assert never.describe().startswith("WASTE: after the load: 3 requests")
    quiet = Tail(at(0, 100, 50), idle, 8, [])
    assert quiet.ok and quiet.bound_tokens == 8  # one step in flight may still count
