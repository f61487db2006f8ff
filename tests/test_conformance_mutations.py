"""Each conformance property catches the engine that breaks it: the suite, run against the
reference engine with one planted fault (tests/conformance_faults.py), fails on the property
meant to catch that fault, in the tests named here, for the reason named here. The unbroken
engine passes the whole suite on every fixture model (``make test`` runs it on tiny-llama,
tests/test_conformance_models.py on the others), so each failure below is the fault's doing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    fault: str
    suite: str  # the property's test file, under conformance/
    select: str  # pytest -k expression: the tests that must fail
    says: str  # what their failure message must say
    model: str = "tiny-llama"
    every: bool = True  # every selected test fails; False: at least one (a per-run budget)
    passed_says: str = ""  # with every=False: what the note of a test that passed says

    @property
    def id(self) -> str:
        return f"{self.fault}-{Path(self.suite).stem.removeprefix('test_')}"


MUTANTS = [
    # abort promptness
    Mutant("no_abort_on_close", "test_abort_promptness.py",
           "cancel-mid_decode or aclose-mid_decode or drop-mid_decode", "after the abort"),
    Mutant("late_abort", "test_abort_promptness.py", "abort-mid_decode or abort-queued",
           "steps after the abort"),
    # Every other abort of the run is late, so a case is often late in its first attempt and on
    # time in its second: the run's retry budget (bounds.ABORT_RETRIES) is spent on the first
    # such cases, and the later ones fail. Those retried within the budget pass, and the
    # summary's notes say so.
    Mutant("sometimes_late_abort", "test_abort_promptness.py",
           "(abort- or abort_list-) and (mid_decode or before_first_output or chunked_prefill)",
           "steps after the abort", every=False,
           passed_says="within the bound at attempt 2"),
    Mutant("abort_list_first_only", "test_abort_promptness.py", "abort_list-mid_decode",
           "after the abort"),
    Mutant("queued_abort_ignored", "test_abort_promptness.py", "abort-queued",
           "finish_reason 'length' after the abort"),
    Mutant("leak_on_chunked_prefill_abort", "test_abort_promptness.py", "chunked_prefill",
           "KV blocks not freed"),
    Mutant("abort_on_last_step_pins_blocks", "test_abort_promptness.py", "last_step",
           "KV blocks not freed"),
    Mutant("refuses_long_prompts", "test_abort_promptness.py", "abort-chunked_prefill",
           "the engine refused request"),
    # abort frees KV and touches no one else
    Mutant("leaky_abort", "test_abort_frees_kv.py", "list", "KV blocks not freed"),
    Mutant("abort_hits_a_neighbour", "test_abort_frees_kv.py", "others_unchanged",
           "a bystander ended by 'abort'"),
    # every ending frees its blocks
    Mutant("leak_on_stop_string", "test_every_ending_frees_kv.py", "default",
           "KV blocks not freed"),
    Mutant("leak_on_eos", "test_every_ending_frees_kv.py", "default", "KV blocks not freed",
           model="tiny-qwen2"),
    Mutant("leak_on_preemption", "test_every_ending_frees_kv.py", "preemption",
           "KV blocks not freed"),
    Mutant("leak_rejected_drafts", "test_every_ending_frees_kv.py", "speculative",
           "KV blocks not freed"),
    # every field of every yield; text
    Mutant("cumulative_text_not_accumulated", "test_stream_fields.py",
           "agrees and length-CUMULATIVE", "is no prefix of the final"),
    Mutant("delta_logprobs_shifted", "test_stream_fields.py", "agrees and length-DELTA",
           "lacks it"),
    Mutant("shared_cumulative_lists", "test_stream_fields.py",
           "does_not_change and length-CUMULATIVE", "the engine changed it later"),
    Mutant("stop_reason_dropped", "test_stream_fields.py", "agrees and stop_string-FINAL_ONLY",
           "does not name what stopped it"),
    Mutant("finish_reason_early", "test_stream_fields.py", "agrees and length-DELTA",
           "(not the last)"),
    Mutant("finished_twice", "test_streaming_shape.py", "only_the_last and not FINAL_ONLY",
           "finished flags"),
    Mutant("finished_twice", "test_lifecycle.py", "state_machine", "finished"),
    Mutant("text_tail_dropped", "test_text_matches_tokens.py", "length-FINAL_ONLY",
           "!= decoded token ids"),
    # offline vs online, under pressure; batching
    Mutant("diverges_online", "test_offline_async_equivalence.py", "each_async",
           "token 0 differs"),
    Mutant("seed_ignored_online", "test_offline_async_equivalence.py", "seeded", "online"),
    Mutant("corrupt_after_preemption", "test_offline_async_equivalence.py", "preemption",
           "online, be preempted"),
    Mutant("corrupt_on_prefix_hit", "test_offline_async_equivalence.py", "prefix_cache",
           "online, reuse the cached blocks"),
    Mutant("one_at_a_time_online", "test_same_scheduler.py", "online",
           "did not share steps"),
    Mutant("forked_scheduler", "test_same_scheduler.py", "same_scheduler_class", "assert"),
    # death, bad input, alias
    Mutant("silent_death", "test_engine_death.py", "raise", "still hang"),
    Mutant("no_validation", "test_bad_input.py", "invalid_sampling_params", "DID NOT RAISE"),
    Mutant("alias_is_another_class", "test_alias_identity.py", "is_the_new_class",
           "is neither"),
]  # fmt: skip


def run_suite(fault: str, suite: str, select: str, model: str, report: Path) -> dict:
    cmd = [
        sys.executable, "-m", "pytest", f"conformance/{suite}", "-k", select,
        f"--engine=tests.conformance_faults:{fault}", f"--model=fixtures/models/{model}",
        f"--conformance-report={report}", "-q", "-p", "no:cacheprovider",
        "--hypothesis-profile=first-failure",
    ]  # fmt: skip
    # A leak shows in 10 s and a hang in 20: the healthy engine needs well under a second.
    env = {**os.environ, "CONFORMANCE_IDLE_TIMEOUT": "10", "CONFORMANCE_STREAM_TIMEOUT": "20"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    written = report.parent / f"{report.name}.json"
    summary = json.loads(written.read_text()) if written.exists() else {"tests": []}
    return {"returncode": proc.returncode, "tail": proc.stdout[-4000:], **summary}


@pytest.mark.parametrize("m", MUTANTS, ids=[m.id for m in MUTANTS])
def test_the_property_catches_the_fault(m: Mutant, tmp_path: Path) -> None:
    result = run_suite(m.fault, m.suite, m.select, m.model, tmp_path / "report")
    assert result["returncode"] == 1, f"the suite did not catch {m.fault}:\n{result['tail']}"
    ran = [t for t in result["tests"] if t["outcome"] != "skipped"]
    assert ran, f"nothing ran for -k {m.select!r}:\n{result['tail']}"
    caught = [t for t in ran if t["outcome"] == "failed"]
    missed = [t["test"] for t in ran if t["outcome"] != "failed"]
    if m.every:
        assert not missed, f"{m.fault}: these passed, expected to fail: {missed}"
    if m.passed_says:
        notes = [t["note"] for t in ran if t["outcome"] == "passed"]
        assert any(m.passed_says in n for n in notes), (
            f"{m.fault}: no test that passed says {m.passed_says!r}: {notes}"
        )
    wrong = [t for t in caught if m.says not in t["note"]]
    assert not wrong, f"{m.fault}: failed for another reason than {m.says!r}: " + "; ".join(
        f"{t['test']}: {t['note']}" for t in wrong
    )
