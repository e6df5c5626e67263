"""Numbers from verdict counts: the unbiased pass@k estimator (Chen et al. 2021; Li et al. 2022) and SPO's soft
value Q̂0 of a prompt from π0's Monte-Carlo successes (paper §3.1.3). Shared by the pipelines, the trainer and the
reports, so it sits below all of them."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where Q̂0 is computed: a report (pass@k alone) does not load it
    import torch

PAPER_BETA = 1.0 / math.log(100_000)  # e^{−1/β} = 1e-5 (paper §5)
# How pass@k is measured unless told otherwise (paper §5): n samples per prompt at this temperature and top-p, reported
# for these k. `spolake eval`, EvalSettings and the training config's eval keys all take their defaults from here.
EVAL_N, EVAL_TEMPERATURE, EVAL_TOP_P, EVAL_KS = 20, 0.4, 0.95, (1, 10)
RESPONSE_TOKENS = 512  # the default response length limit, of evaluation samples and of training rollouts


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


def check_beta(beta: float) -> None:
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")


def soft_value(success_rate: torch.Tensor, beta: float) -> torch.Tensor:
    """Q = β·log(S + (1−S)·e^{−1/β}) (§3.1.3), in log space so S = 0 gives exactly −1 for any β."""
    import torch

    return beta * torch.logaddexp(torch.log(success_rate), torch.log1p(-success_rate) - 1.0 / beta)


def q0_from_counts(n, n_success, beta: float, prior: float = 0.0):
    """Q̂0 = β·log(S0 + (1−S0)·e^{−1/β}), S0 = n_success / n (§3.1.3), from Monte-Carlo counts of π0.

    `prior` a > 0 uses the Beta(a, a) posterior mean S0 = (n_success + a) / (n + 2a) instead: with few samples
    (16, not the paper's 800) s = 0 is common for prompts π0 does solve now and then, and S0 = 0 sets Q̂0 = −1, which
    asks any success on the prompt to raise its log-probability by 1/β ≈ 11.5 nats.

    Floats in → float out; tensors in → tensor out (the floating dtype of the inputs, else the default dtype).
    """
    import torch

    check_beta(beta)
    as_tensor = isinstance(n, torch.Tensor) or isinstance(n_success, torch.Tensor)
    n64 = torch.as_tensor(n, dtype=torch.float64)
    s64 = torch.as_tensor(n_success, dtype=torch.float64)
    if bool((n64 <= 0).any()) or bool((s64 < 0).any()) or bool((s64 > n64).any()):
        shown = "" if as_tensor else f", got n={n}, n_success={n_success}"
        raise ValueError(f"q0_from_counts needs n > 0 and 0 <= n_success <= n{shown}")
    if prior < 0:
        raise ValueError(f"q0_from_counts needs prior >= 0, got {prior}")
    q0 = soft_value((s64 + prior) / (n64 + 2 * prior), beta)
    if not as_tensor:
        return float(q0)
    floating = [t.dtype for t in (n_success, n) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    return q0.to(floating[0] if floating else torch.get_default_dtype())
