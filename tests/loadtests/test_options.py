import random

import pytest

from loadtests.options import make_mix, parse_mix, parse_span


def test_span_parses_ranges_and_single_values():
    assert (parse_span("16-64").lo, parse_span("16-64").hi) == (16, 64)
    assert parse_span("0.5").draw(random.Random(0)) == 0.5
    for bad in ("5-1", "-3", "1-2-3", "x"):
        with pytest.raises(ValueError):
            parse_span(bad)


def test_mix_weights_and_unknown_kinds():
    assert parse_mix("full=3", ("full", "burst")) == {"full": 3.0, "burst": 0.0}
    with pytest.raises(ValueError, match="unknown kind"):
        parse_mix("nope=1", ("full", "burst"))
    with pytest.raises(ValueError, match="zero"):
        parse_mix("full=0", ("full", "burst"))


def test_disconnect_ratio_holds_per_request_with_bursts():
    mix = make_mix(0.5, "first-byte=1,after-chunks=2", "full=1,burst=1", burst_size=4)
    rng = random.Random(1)
    draws = [mix.draw(rng) for _ in range(20000)]
    requests = [k for d in draws for k in [d] * (4 if d == "burst" else 1)]
    disconnects = sum(k in ("first-byte", "after-chunks") for k in requests)
    assert abs(disconnects / len(requests) - 0.5) < 0.02
    assert "client-timeout" not in draws


def test_ratio_bounds():
    assert make_mix(0.0, "first-byte=1", "full=1").draw(random.Random(0)) == "full"
    assert make_mix(1.0, "first-byte=1", "full=1").draw(random.Random(0)) == "first-byte"
    with pytest.raises(ValueError):
        make_mix(1.5, "first-byte=1", "full=1")
