"""The counting convention: the formula against a literal simulation of the lab's two loops."""

from __future__ import annotations

import pytest

from kvviz.core.counting import WorkCount, kv_with_cache, kv_without_cache, plural
from kvviz.core.errors import KvvizError


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


def test_plural_counts():
    assert plural(1, "new token") == "1 new token"
    assert plural(2, "new token") == "2 new tokens"
    assert plural(0, "layer") == "0 layers"
    assert plural(1000, "token") == "1,000 tokens"


def test_report_says_plainly_that_a_single_new_token_costs_one_more():
    work = WorkCount(3, 1)
    assert (work.with_cache, work.without_cache) == (4, 3)
    assert work.report().splitlines() == [
        "K/V computations per layer for P=3 prompt tokens and N=1 new token",
        "  without cache          3   N*P + N(N-1)/2 = 1*3 + 1*0/2",
        "  with cache             4   P + N = 3 + 1",
        "  extra                  1",
        "  for a single new token the cache does one more K/V computation than no cache:",
        "  its final pass stores the new token's K/V. The cache pays off from the second new token on.",
    ]


def test_report_from_two_new_tokens_on():
    assert WorkCount(3, 2).report().splitlines() == [
        "K/V computations per layer for P=3 prompt tokens and N=2 new tokens",
        "  without cache          7   N*P + N(N-1)/2 = 2*3 + 2*1/2",
        "  with cache             5   P + N = 3 + 2",
        "  avoided                2",
        "  without the cache: 1.4x the K/V work",
    ]
    assert WorkCount(1, 2, layers=3).report().splitlines()[1:] == [
        "  without cache          3   N*P + N(N-1)/2 = 2*1 + 2*1/2   all 3 layers: 9",
        "  with cache             3   P + N = 1 + 2   all 3 layers: 9",
        "  avoided                0   all 3 layers: 0",
        "  the same K/V work with and without the cache; the cache pays off from the third new token on",
    ]


@pytest.mark.parametrize("P", [1, 2, 3, 7])
def test_the_cache_pays_off_from_the_token_the_loops_say(P):
    first = next(N for N in range(1, 10) if _simulate_without_cache(P, N) > _simulate_with_cache(P, N))
    assert WorkCount(P, 1).pays_off_from == first == (3 if P == 1 else 2)


@pytest.mark.parametrize("kwargs", [
    dict(prompt_tokens=10**12 + 1, new_tokens=3),
    dict(prompt_tokens=3, new_tokens=10**400),  # its ratio would not fit a float
    dict(prompt_tokens=3, new_tokens=3, layers=10**30),
    dict(prompt_tokens=True, new_tokens=3),
    dict(prompt_tokens=3.0, new_tokens=3),
])
def test_counts_beyond_any_model_are_refused(kwargs):
    with pytest.raises(KvvizError, match="must be a whole number from 1 to 1,000,000,000,000"):
        WorkCount(**kwargs)


def test_the_largest_counts_still_give_a_ratio():
    work = WorkCount(10**12, 10**12, layers=10**12)
    assert work.with_cache == 2 * 10**12 and work.ratio == pytest.approx(0.75 * 10**12)
