"""The demo's statistics, pure functions: mean ± std over seeds, and paired differences with bootstrap intervals.

A claim such as "SPO pass@10 > PPO pass@10" is tested on *paired* data: the two methods were trained from the same
seed's lake and evaluated on the same held-out prompts, so the difference is taken prompt by prompt. The 95 %
interval resamples prompts within each seed (stratified bootstrap), then averages the per-seed mean differences:
it reflects prompt-to-prompt noise and the seeds at hand; with 3 seeds it cannot capture seed-to-seed variation
fully, which is why the per-seed differences are printed too.
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from spo_lake.scores import pass_at_k


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def per_prompt_pass(counts: Sequence[Sequence], k: int) -> dict[str, float]:
    """{prompt_id: pass@k} from (prompt_id, n, correct) rows."""
    return {pid: pass_at_k(n, c, k) for pid, n, c in counts}


@dataclass(frozen=True)
class Paired:
    """A paired difference a − b: its mean, a 95 % bootstrap interval, and the mean difference of each seed."""

    mean: float
    low: float
    high: float
    per_seed: tuple[float, ...]

    @property
    def verdict(self) -> str:
        if self.low > 0:
            return "holds"
        if self.high < 0:
            return "reversed"
        return "not shown"


def paired_prompt_difference(a: Sequence[dict[str, float]], b: Sequence[dict[str, float]], *, resamples: int = 2000,
                             seed: int = 0) -> Paired:
    """Mean over seeds of the mean per-prompt difference a − b; a[i], b[i] are {prompt: value} of seed i."""
    diffs = []
    for a_seed, b_seed in zip(a, b, strict=True):
        if set(a_seed) != set(b_seed) or not a_seed:
            raise ValueError("paired comparison needs both methods evaluated on the same, non-empty prompt set")
        diffs.append([a_seed[p] - b_seed[p] for p in sorted(a_seed)])
    return _bootstrap(diffs, resamples, seed)


def paired_seed_difference(a: Sequence[float], b: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> Paired:
    """A difference with one paired value per seed (e.g. wall time): the bootstrap resamples seeds."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in diffs) / len(diffs) for _ in range(resamples))
    return Paired(sum(diffs) / len(diffs), _quantile(means, 0.025), _quantile(means, 0.975), tuple(diffs))


def _bootstrap(diffs: list[list[float]], resamples: int, seed: int) -> Paired:
    rng = random.Random(seed)
    per_seed = tuple(sum(d) / len(d) for d in diffs)
    means = sorted(
        sum(sum(rng.choice(d) for _ in d) / len(d) for d in diffs) / len(diffs) for _ in range(resamples)
    )
    return Paired(sum(per_seed) / len(per_seed), _quantile(means, 0.025), _quantile(means, 0.975), per_seed)


def _quantile(sorted_values: list[float], q: float) -> float:
    index = q * (len(sorted_values) - 1)
    lo, hi = math.floor(index), math.ceil(index)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (index - lo)
