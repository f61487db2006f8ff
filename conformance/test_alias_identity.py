"""Alias identity: the old name still imports from its old place and is the new class.

vLLM 0.27 and later keep ``AsyncLLMEngine`` as an alias of ``AsyncLLM``; code written against the
old name must get the same engine, not a look-alike.

Catches: an old name that became a class of its own (a look-alike whose engine behaves
differently), or disappeared from its old module.

Bound: identity or subclass; the engine built through the old name gives the same greedy output
(near-tie rule).
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from conformance.compare import equivalence_problem
from conformance.scenarios import generate_one

pytestmark = pytest.mark.requires("has_alias")


def _pair(adapter: Any) -> tuple[type, type]:
    a = adapter.alias
    old = getattr(importlib.import_module(a.old_module), a.old_name)
    new = getattr(importlib.import_module(a.new_module), a.new_name)
    return old, new


def test_old_name_imports_from_its_old_place(adapter: Any) -> None:
    a = adapter.alias
    module = importlib.import_module(a.old_module)
    assert hasattr(module, a.old_name), f"{a.old_module} has no {a.old_name}"


def test_old_name_is_the_new_class(adapter: Any, record_property: Any) -> None:
    old, new = _pair(adapter)
    assert isinstance(old, type), f"{adapter.alias.old_name} is {old!r}, not a class"
    assert old is new or issubclass(old, new), (
        f"{adapter.alias.old_name} ({old.__module__}.{old.__qualname__}) is neither "
        f"{adapter.alias.new_name} nor a subclass of it"
    )
    relation = "identity" if old is new else "subclass"
    record_property("note", f"{adapter.alias.old_name} → {adapter.alias.new_name}: {relation}")


def test_engine_built_through_old_name_behaves_the_same(
    adapter: Any, aio: Any, online: Any, vocab: Any
) -> None:
    old, new = _pair(adapter)
    built = aio.call(adapter.make_online_via_alias)
    try:
        assert isinstance(built, new), f"built through the old name: {type(built)!r}"
        prompt = {"prompt_token_ids": list(range(vocab.low, vocab.low + 12))}
        params = adapter.sampling_params(temperature=0.0, max_tokens=12, logprobs=5)
        via_old = aio.run(generate_one(built, prompt, params, "alias"))
        via_new = aio.run(generate_one(online, prompt, params, "alias"))
        assert via_old.error is None and via_new.error is None, (via_old.error, via_new.error)
        problem = equivalence_problem(
            via_new.final.outputs[0],
            via_old.final.outputs[0],
            exact=adapter.capabilities.batch_invariant,
            greedy=True,
        )
        assert problem is None, problem
    finally:
        aio.call(lambda: adapter.shutdown(built))
