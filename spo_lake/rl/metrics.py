"""Evaluation metrics: the unbiased pass@k estimator (Chen et al. 2021; Li et al. 2022)."""

from __future__ import annotations

import operator
from collections.abc import Sequence


def _count(value, name: str) -> int:
    try:
        count = operator.index(value)
    except TypeError:
        raise ValueError(f"pass@k: {name} must be an integer, got {value!r}") from None
    if count < 0:
        raise ValueError(f"pass@k: {name} must be >= 0, got {count}")
    return count


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), given c correct.

    1 − C(n−c, k)/C(n, k), computed as the product 1 − Π_{i=n−c+1..n} (1 − k/i) so large n never overflows.
    """
    n, c, k = _count(n, "n"), _count(c, "c"), _count(k, "k")
    if k == 0 or k > n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if c > n:
        raise ValueError(f"pass@k needs c <= n, got c={c}, n={n}")
    if n - c < k:
        return 1.0  # every k-subset contains a correct sample
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def mean_pass_at_k(ns: Sequence[int], cs: Sequence[int], k: int) -> float:
    """pass@k averaged over problems; ns[i] samples of problem i, cs[i] of them correct."""
    if len(ns) != len(cs):
        raise ValueError(f"mean_pass_at_k: ns and cs differ in length ({len(ns)} vs {len(cs)})")
    if len(ns) == 0:
        raise ValueError("mean_pass_at_k: no problems given")
    scores = []
    for index, (n, c) in enumerate(zip(ns, cs)):
        try:
            scores.append(pass_at_k(n, c, k))
        except ValueError as error:
            raise ValueError(f"problem {index}: {error}") from None
    return sum(scores) / len(scores)
