"""Block accounting: reference counts, prefix-cache hits, eviction, trimming."""

import pytest

from reference_engine.block_manager import KVCacheManager
from reference_engine.request import Request
from reference_engine.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, None, tokens, SamplingParams(max_tokens=8), eos_token_ids=[])


def allocate_all(kv: KVCacheManager, req: Request) -> list[int]:
    hits = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - len(hits) * BS, hits)
    req.num_computed_tokens = req.num_tokens
    kv.cache_full_blocks(req)
    return hits


def test_allocate_and_free_restore_every_block():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    req = make_request("a", list(range(10)))
    allocate_all(kv, req)
    assert len(kv.blocks_of("a")) == 3
    assert kv.stats().num_free_blocks == 5
    kv.free_request(req)
    stats = kv.stats()
    assert stats.num_free_blocks == stats.num_total_blocks == 8
    assert stats.num_cached_blocks == 2  # the two full blocks stay cached, evictable
    assert stats.usage == 0


def test_prefix_hit_shares_blocks_and_counts_references():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a = make_request("a", list(range(9)))
    allocate_all(kv, a)
    b = make_request("b", list(range(8)) + [99, 98])
    hits = allocate_all(kv, b)
    assert hits == kv.blocks_of("a")[:2]
    assert all(kv.ref_counts[h] == 2 for h in hits)
    kv.free_request(a)
    assert all(kv.ref_counts[h] == 1 for h in hits)
    assert kv.stats().num_free_blocks == 8 - 3  # b holds 2 shared + 1 own
    kv.free_request(b)
    assert kv.stats().num_free_blocks == 8


def test_hit_always_leaves_one_token_to_compute():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    allocate_all(kv, make_request("a", list(range(8))))
    again = make_request("b", list(range(8)))
    assert len(kv.get_computed_blocks(again)) == 1  # not 2: the last token must be computed


def test_a_different_prefix_misses_even_with_equal_later_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    allocate_all(kv, make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 0]))
    other = make_request("b", [9, 9, 9, 9, 5, 6, 7, 8, 0])
    assert kv.get_computed_blocks(other) == []


def test_eviction_takes_least_recently_freed_cached_block():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    a = make_request("a", list(range(5)))
    allocate_all(kv, a)
    kv.free_request(a)
    assert kv.stats().num_cached_blocks == 1
    big = make_request("big", list(range(100, 116)))  # needs all 4 blocks
    allocate_all(kv, big)
    assert kv.stats().num_cached_blocks == 0
    assert kv.get_computed_blocks(make_request("c", list(range(5)))) == []


def test_failed_allocation_changes_nothing():
    kv = KVCacheManager(num_blocks=2, block_size=BS)
    req = make_request("a", list(range(12)))
    before = (kv.stats(), list(kv.ref_counts))
    assert not kv.allocate_slots(req, 12)
    assert (kv.stats(), list(kv.ref_counts)) == before
    assert kv.blocks_of("a") == []


def test_trim_releases_blocks_of_rejected_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    req = make_request("a", list(range(3)))
    assert kv.allocate_slots(req, 3 + 6)  # three tokens plus six drafts: 3 blocks
    assert len(kv.blocks_of("a")) == 3
    kv.trim(req, 4)
    assert len(kv.blocks_of("a")) == 1
    assert kv.stats().num_free_blocks == 7


def test_double_release_is_caught():
    kv = KVCacheManager(num_blocks=2, block_size=BS)
    req = make_request("a", [1])
    allocate_all(kv, req)
    block = kv.blocks_of("a")[0]
    kv.free_request(req)
    with pytest.raises(AssertionError):
        kv._release(block)


def test_a_block_enters_the_prefix_cache_in_the_step_that_fills_it():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    req = make_request("a", list(range(6)))
    assert kv.allocate_slots(req, 6)
    req.num_computed_tokens = 6  # a chunk that fills block 0 and ends inside block 1
    kv.cache_full_blocks(req)
    assert kv.cached == {kv._hashes(req)[0]: kv.blocks_of("a")[0]}
    for tok in range(6, 13):  # then decode steps of one token each
        req.append_token(tok)
        assert kv.allocate_slots(req, 1)
        req.num_computed_tokens += 1
        kv.cache_full_blocks(req)
        num_full = req.num_computed_tokens // BS
        assert sorted(kv.cached.values()) == sorted(kv.blocks_of("a")[:num_full])
    assert len(kv.cached) == 3
