"""pass@k: against brute-force enumeration of k-subsets, exact rationals at large n, and edge cases."""

import itertools
from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spo_lake.scores import mean_pass_at_k, pass_at_k


@st.composite
def n_c_k(draw):
    n = draw(st.integers(1, 10))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@given(n_c_k())
def test_pass_at_k_equals_share_of_k_subsets_with_a_correct_sample(case):
    n, c, k = case
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


@pytest.mark.parametrize("n, c, k", [(2000, 1, 1), (2000, 3, 100), (10000, 7, 1000), (500, 490, 5)])
def test_pass_at_k_is_stable_at_large_n(n, c, k):
    exact = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-9)


def test_pass_at_k_edge_cases():
    assert pass_at_k(20, 0, 10) == 0.0
    assert pass_at_k(20, 20, 1) == 1.0
    assert pass_at_k(20, 11, 10) == 1.0  # fewer than k wrong samples: every draw contains a correct one
    assert pass_at_k(20, 5, 1) == pytest.approx(0.25)
    assert pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize(
    "n, c, k, message",
    [(5, 1, 6, "1 <= k <= n"), (5, 6, 1, "c <= n"), (5, -1, 1, "c must be >= 0"), (-5, 1, 1, "n must be >= 0"),
     (5, 1, 0, "1 <= k <= n"), (5, 1.5, 1, "c must be an integer")],
)
def test_pass_at_k_rejects_bad_counts(n, c, k, message):
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    assert mean_pass_at_k([20, 20, 10], [0, 20, 5], 1) == pytest.approx((0.0 + 1.0 + 0.5) / 3)
    with pytest.raises(ValueError, match="problem 1"):
        mean_pass_at_k([20, 5], [1, 1], 10)
    with pytest.raises(ValueError, match="no problems"):
        mean_pass_at_k([], [], 1)
    with pytest.raises(ValueError, match="differ in length"):
        mean_pass_at_k([20], [1, 2], 1)
