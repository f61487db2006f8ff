"""The runner's block-table arrays: rows zero-padded to the longest, and the chained step's copies
kept between steps never outlive the table they copy."""

import random
from types import SimpleNamespace

import numpy as np

from reference_engine.model_runner import ModelRunner, _padded_table


def naive(tables: list[list[int]]) -> np.ndarray:
    width = max(len(t) for t in tables)
    return np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32)


def table_rows(runner, tables: dict[str, list[int]]) -> np.ndarray:
    reqs = [SimpleNamespace(request_id=rid) for rid in tables]
    return ModelRunner._table_rows(runner, reqs, list(tables.values()))


def test_padded_table_pads_each_row_with_zeros():
    rng = random.Random(0)
    for _ in range(50):
        tables = [
            [rng.randrange(1, 1000) for _ in range(rng.randint(1, 20))]
            for _ in range(rng.randint(1, 9))
        ]
        out = _padded_table(tables)
        assert out.dtype == np.int32
        assert np.array_equal(out, naive(tables))


def test_chained_table_rows_follow_growing_and_replaced_tables():
    rng = random.Random(1)
    runner = SimpleNamespace(_np_blocks={})
    tables = {str(i): [rng.randrange(1000)] for i in range(6)}
    for step in range(60):
        rid = rng.choice(list(tables))
        if step % 3 == 0:  # a new block, appended to the same list
            tables[rid].append(rng.randrange(1000))
        elif step % 3 == 1:  # preempted and readmitted: a new list, maybe of the same length
            tables[rid] = [rng.randrange(1000) for _ in tables[rid]]
        else:  # finished, and another request joins
            del tables[rid]
            tables[f"new{step}"] = [rng.randrange(1000) for _ in range(rng.randint(1, 4))]
        assert np.array_equal(table_rows(runner, tables), naive(list(tables.values())))


def test_a_table_freed_and_replaced_at_the_same_address_is_not_mistaken_for_it():
    runner = SimpleNamespace(_np_blocks={})
    old = [1, 2, 3]
    assert table_rows(runner, {"r": old}).tolist() == [[1, 2, 3]]
    del old  # CPython hands the freed list's memory, and so its id, to the next new list
    new = [7, 8, 9]
    assert table_rows(runner, {"r": new}).tolist() == [[7, 8, 9]]
