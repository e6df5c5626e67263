"""Off-policy convergence: a tabular policy trained only on samples of π0 reaches π* = π0·exp(r/β)/Z.

Vocabulary 3, length 3: 27 sequences, one logits row per prefix (1 + 3 + 9 = 13 rows). Reward 0 when the token
sum is divisible by 3, else −1. β is the paper's 1/ln(100000) (e^{−1/β} = 1e-5), so π* is π0 restricted to the
successes up to a 1e-5 leak. Q̂0 is the exact soft value of π0, so Q_T = r on every sequence is attainable
(Theorem 2.1) and every objective shares the optimum π*. KL(πθ‖π*) is computed exactly by enumeration.
"""

import itertools
import math

import pytest
import torch

from spo_lake.rl.losses import spo_loss
from spo_lake.scores import q0_from_counts

VOCAB, LENGTH = 3, 3
BETA = 1 / math.log(100000)
STEPS, BATCH, LR = 1000, 256, 0.1

SEQUENCES = torch.tensor(list(itertools.product(range(VOCAB), repeat=LENGTH)))  # (27, 3)
REWARD = torch.where(SEQUENCES.sum(dim=1) % 3 == 0, 0.0, -1.0).double()


def prefix_rows(sequences: torch.Tensor) -> torch.Tensor:
    """Row of the logits table that holds the prefix a_<t of each position t, (N, LENGTH)."""
    rows, offset = [], 0
    for t in range(LENGTH):
        code = torch.zeros(len(sequences), dtype=torch.long)
        for i in range(t):
            code = code * VOCAB + sequences[:, i]
        rows.append(offset + code)
        offset += VOCAB**t
    return torch.stack(rows, dim=1)


ROWS = prefix_rows(SEQUENCES)
N_PREFIXES = sum(VOCAB**t for t in range(LENGTH))


def token_logprobs(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log π(a_t | a_<t) of the enumerated sequences picked by index, (len(index), LENGTH)."""
    return torch.log_softmax(table, dim=-1)[ROWS[index], SEQUENCES[index]]


def kl_to_target(table: torch.Tensor, log_target: torch.Tensor) -> float:
    log_policy = token_logprobs(table, torch.arange(len(SEQUENCES))).sum(dim=1)
    return float((log_policy.exp() * (log_policy - log_target)).sum())


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """The tensors are tiny: intra-op threads only add synchronisation, and stall badly on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference():
    ref_table = torch.randn(N_PREFIXES, VOCAB, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    log_p0 = token_logprobs(ref_table, torch.arange(len(SEQUENCES))).sum(dim=1)
    log_target = log_p0 + REWARD / BETA
    log_target = log_target - torch.logsumexp(log_target, dim=0)  # π* = π0·exp(r/β)/Z
    success_rate = float((log_p0.exp() * (REWARD == 0)).sum())
    return ref_table, log_p0.exp(), log_target, q0_from_counts(1.0, success_rate, BETA)


@pytest.mark.parametrize(
    "objective, loss, with_mc",
    [
        ("terminal", "squared", False),
        ("terminal", "ce", False),
        ("reverse_q", "squared", False),
        ("reverse_q", "ce", False),
        ("advantage", "ce", False),
        ("terminal", "squared", True),
        ("terminal", "ce", True),
    ],
)
def test_training_on_reference_samples_reaches_the_soft_optimum(reference, objective, loss, with_mc):
    ref_table, p0, log_target, q0 = reference
    assert kl_to_target(ref_table, log_target) > 1.0  # the starting point π0 is far from π*

    # Exact Monte-Carlo targets: success rate of π0 after each prefix (positions 1 and 2).
    success = (REWARD == 0).double()
    prefix_success = []
    for t in (1, 2):
        same_prefix = (SEQUENCES[:, None, :t] == SEQUENCES[None, :, :t]).all(dim=2).double()
        prefix_success.append((same_prefix @ (p0 * success)) / (same_prefix @ p0))
    prefix_success = torch.stack(prefix_success, dim=1)  # (27, 2)

    generator = torch.Generator().manual_seed(1)
    table = ref_table.clone().requires_grad_(True)
    optimizer = torch.optim.Adam([table], lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / STEPS)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    for _ in range(STEPS):
        index = torch.multinomial(p0, BATCH, replacement=True, generator=generator)  # samples of π0 only
        mc = {}
        if with_mc:
            mc = dict(
                mc_positions=torch.tensor([1, 2]).expand(BATCH, 2),
                mc_success=prefix_success[index],
                mc_mask=torch.ones(BATCH, 2, dtype=torch.bool),
            )
        out = spo_loss(
            token_logprobs(table, index),
            token_logprobs(ref_table, index),
            mask,
            REWARD[index],
            torch.full((BATCH,), q0, dtype=torch.float64),
            BETA,
            objective=objective,
            loss=loss,
            **mc,
        )
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        schedule.step()

    assert kl_to_target(table.detach(), log_target) < 0.02
