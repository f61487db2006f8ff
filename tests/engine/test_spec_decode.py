"""N-gram drafting and the speculative engine path."""

from reference_engine.config import SpeculativeConfig
from reference_engine.spec_decode import NgramProposer


def propose(tokens, k=3, lo=1, hi=3):
    return NgramProposer(SpeculativeConfig("ngram", k, lo, hi)).propose(tokens)


def test_longest_suffix_match_wins_and_the_latest_occurrence_is_used():
    assert propose([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3]) == [7, 8, 1]
    assert propose([5, 6, 1, 2, 7, 1, 2]) == [7, 1, 2]


def test_falls_back_to_shorter_ngrams_and_to_nothing():
    assert propose([4, 1, 8, 9, 2, 3, 1], hi=3) == [8, 9, 2]
    assert propose([1, 2, 3, 4]) == []
    assert propose([7]) == []
    assert propose([1, 2, 3, 1], lo=2) == []


def test_proposals_are_cut_at_the_sequence_end():
    assert propose([1, 2, 1], k=5) == [2, 1]
