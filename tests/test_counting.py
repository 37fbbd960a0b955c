"""The counting convention: the formula against a literal simulation of the lab's two loops."""

from __future__ import annotations

import pytest

from kvviz.counting import WorkCount, kv_with_cache, kv_without_cache
from kvviz.errors import KvvizError


def _simulate_without_cache(P: int, N: int) -> int:
    """The reference loop without a cache: each of N steps re-projects K/V for the whole sequence so far."""
    sequence, computed = P, 0
    for _ in range(N):
        computed += sequence
        sequence += 1
    return computed


def _simulate_with_cache(P: int, N: int) -> int:
    """The reference loop with a cache: the prompt once, then each new token once (the last one is fed too)."""
    computed = P
    for _ in range(N):
        computed += 1
    return computed


@pytest.mark.parametrize("P", [1, 2, 3, 10, 100])
@pytest.mark.parametrize("N", [1, 2, 12, 50, 200])
def test_formula_equals_the_loops(P, N):
    assert kv_without_cache(P, N) == _simulate_without_cache(P, N) == N * P + N * (N - 1) // 2
    assert kv_with_cache(P, N) == _simulate_with_cache(P, N) == P + N


def test_the_lesson_numbers():
    work = WorkCount(3, 12)
    assert (work.with_cache, work.without_cache, work.avoided) == (15, 102, 87)
    assert work.ratio == pytest.approx(6.8)


def test_all_layers():
    work = WorkCount(3, 12, layers=12)
    data = work.as_dict()
    assert data["with_cache"] == 15 and data["without_cache"] == 102 and data["avoided"] == 87
    assert data["ratio"] == 6.8
    assert data["with_cache_all_layers"] == 180
    assert data["without_cache_all_layers"] == 1224
    assert data["avoided_all_layers"] == 1044
    assert (data["prompt_tokens"], data["new_tokens"], data["layers"]) == (3, 12, 12)


def test_a_single_new_token_costs_one_more_with_the_cache():
    """One new token: the uncached loop runs once over P tokens; the cached one also feeds the new token."""
    work = WorkCount(5, 1)
    assert work.without_cache == 5 and work.with_cache == 6 and work.avoided == -1


@pytest.mark.parametrize("field,kwargs", [
    ("prompt-tokens", dict(prompt_tokens=0, new_tokens=3)),
    ("new-tokens", dict(prompt_tokens=3, new_tokens=0)),
    ("layers", dict(prompt_tokens=3, new_tokens=3, layers=-1)),
])
def test_counts_must_be_positive(field, kwargs):
    with pytest.raises(KvvizError, match=field):  # the CLI and the app report KvvizError as one line
        WorkCount(**kwargs)


def test_work_count_is_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        WorkCount(3, 12).layers = 2  # type: ignore[misc]
