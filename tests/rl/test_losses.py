"""SPO losses: hand-computed values, gradients, padding invariance, the Bellman identity (Thm 2.2), errors."""

import itertools
import math

import pytest
import torch

from spo_lake.rl.losses import cumulative_q, log1mexp, log_prob_cross_entropy, spo_loss
from spo_lake.scores import q0_from_counts

PAPER_BETA = 1 / math.log(100000)

# A hand-worked batch, β = 0.5 (so e^{−1/β} = e^{−2}):
#   seq 0: 3 tokens, log-ratios (0.2, −0.1, 0.4) → A = (0.1, −0.05, 0.2), q0 = −0.2
#          → Q = (−0.2, −0.1, −0.15, 0.05), r = 0
#   seq 1: 2 tokens, log-ratios (−0.5, 0.5) → A = (−0.25, 0.25), q0 = −0.6
#          → Q = (−0.6, −0.85, −0.6) and −0.6 repeated on the padded position, r = −1
BETA = 0.5
POLICY = [[-0.1, -0.5, -0.2], [-1.0, -0.2, 0.0]]
REF = [[-0.3, -0.4, -0.6], [-0.5, -0.7, 0.0]]
MASK = [[True, True, True], [True, True, False]]
REWARD = [0.0, -1.0]
Q0 = [-0.2, -0.6]
Q_TABLE = [[-0.2, -0.1, -0.15, 0.05], [-0.6, -0.85, -0.6, -0.6]]


def batch(dtype=torch.float64, requires_grad=False):
    policy = torch.tensor(POLICY, dtype=dtype, requires_grad=requires_grad)
    return dict(
        policy_logprobs=policy,
        ref_logprobs=torch.tensor(REF, dtype=dtype),
        mask=torch.tensor(MASK),
        reward=torch.tensor(REWARD, dtype=dtype),
        q0=torch.tensor(Q0, dtype=dtype),
        beta=BETA,
    )


def ce(logp: float, x: float, eps: float = 1e-6) -> float:
    """The paper's clipped cross-entropy, written out for one scalar."""
    return x * max(-logp, 0.0) - (1 - x) * math.log(1 - math.exp(min(logp, -eps)))


def test_cumulative_q_hand_values_and_padding_repeats_q_terminal():
    b = batch()
    q = cumulative_q(b["policy_logprobs"], b["ref_logprobs"], b["q0"], b["mask"], BETA)
    assert q.shape == (2, 4)
    torch.testing.assert_close(q, torch.tensor(Q_TABLE, dtype=torch.float64))


def test_terminal_squared_hand_value_and_metrics():
    out = spo_loss(**batch(), objective="terminal", loss="squared")
    # (0.05 − 0)² = 0.0025 and (−0.6 + 1)² = 0.16
    assert out.loss.item() == pytest.approx((0.0025 + 0.16) / 2)
    torch.testing.assert_close(out.per_sequence, torch.tensor([0.0025, 0.16], dtype=torch.float64))
    assert out.q_terminal_mean.item() == pytest.approx((0.05 - 0.6) / 2)
    assert out.abs_err_mean.item() == pytest.approx((0.05 + 0.4) / 2)
    assert out.advantage_mean.item() == pytest.approx((0.1 - 0.05 + 0.2 - 0.25 + 0.25) / 5)
    assert out.kl_estimate.item() == pytest.approx((0.5 + 0.0) / 2)


def test_terminal_ce_hand_value():
    out = spo_loss(**batch(), objective="terminal", loss="ce")
    # seq 0: ℓ̂ = 0.05/0.5 = 0.1 > 0 is clipped to −eps; x = exp(0) = 1, so only x·relu(−0.1) = 0 remains.
    seq1 = math.exp(-2) * 1.2 - (1 - math.exp(-2)) * math.log(1 - math.exp(-1.2))  # ℓ̂ = −1.2, x = e^{−2}
    assert out.per_sequence[0].item() == pytest.approx(0.0, abs=1e-12)
    assert out.per_sequence[1].item() == pytest.approx(seq1)
    assert out.loss.item() == pytest.approx(seq1 / 2)


def test_reverse_q_squared_hand_value_and_semi_gradient():
    b = batch(requires_grad=True)
    out = spo_loss(**b, objective="reverse_q", loss="squared")
    # every term's error equals the terminal one (§3.1.2): 3·0.05² and 2·0.4²
    assert out.loss.item() == pytest.approx((3 * 0.0025 + 2 * 0.16) / 2)
    out.loss.backward()
    # only Q_t carries gradient and Q_t contains tokens 1..t, so token t is hit by (T − t + 1) terms of 2β(Q_T − r)
    expected = torch.tensor(
        [[2 * BETA * 0.05 * n for n in (3, 2, 1)], [2 * BETA * 0.4 * n for n in (2, 1)] + [0.0]],
        dtype=torch.float64,
    ) / 2
    torch.testing.assert_close(b["policy_logprobs"].grad, expected)


def test_reverse_q_ce_hand_value():
    out = spo_loss(**batch(), objective="reverse_q", loss="ce")
    # R_t = Q_t + r − Q_T, ℓ̂ = Q_t/β, x = exp(R_t/β)
    # seq 0: Q_t = (−0.1, −0.15, 0.05), R = (−0.15, −0.2, 0); seq 1: Q_t = (−0.85, −0.6), R = (−1.25, −1)
    seq0 = ce(-0.2, math.exp(-0.3)) + ce(-0.3, math.exp(-0.4)) + ce(0.1, 1.0)
    seq1 = ce(-1.7, math.exp(-2.5)) + ce(-1.2, math.exp(-2.0))
    torch.testing.assert_close(out.per_sequence, torch.tensor([seq0, seq1], dtype=torch.float64))


def test_advantage_ce_hand_value():
    out = spo_loss(**batch(), objective="advantage", loss="ce")

    def bce(logit: float, target: float) -> float:
        p = 1 / (1 + math.exp(-logit))
        return -(target * math.log(p) + (1 - target) * math.log(1 - p))

    sigmoid = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    # Σ log-ratio = 0.5 and 0.0; targets σ((r − q0)/β) = σ(0.4) and σ(−0.8)
    expected = [bce(0.5, sigmoid(0.4)), math.log(2.0)]
    torch.testing.assert_close(out.per_sequence, torch.tensor(expected, dtype=torch.float64))
    # advantage_scale s warps both sides by σ(·/(sβ)): logits and target logits divide by s
    scaled = spo_loss(**batch(), objective="advantage", loss="ce", advantage_scale=2.0)
    expected = [bce(0.25, sigmoid(0.2)), math.log(2.0)]
    torch.testing.assert_close(scaled.per_sequence, torch.tensor(expected, dtype=torch.float64))


def mc_inputs():
    # seq 0: after 1 token S = 0.5, after all 3 tokens S = 1; seq 1: at the prompt S = 0.2, one padded entry (garbage)
    return dict(
        mc_positions=torch.tensor([[1, 3], [0, 99]]),
        mc_success=torch.tensor([[0.5, 1.0], [0.2, float("nan")]], dtype=torch.float64),
        mc_mask=torch.tensor([[True, True], [True, False]]),
    )


def test_monte_carlo_targets_squared_hand_value():
    terminal = spo_loss(**batch(), objective="terminal", loss="squared")
    out = spo_loss(**batch(), objective="terminal", loss="squared", **mc_inputs())
    target = lambda s: BETA * math.log(s + (1 - s) * math.exp(-2))  # noqa: E731
    mc0 = (-0.1 - target(0.5)) ** 2 + (0.05 - 0.0) ** 2  # Q_1 = −0.1, Q_3 = 0.05
    mc1 = (-0.6 - target(0.2)) ** 2  # Q_0 = q0
    torch.testing.assert_close(out.per_sequence - terminal.per_sequence, torch.tensor([mc0, mc1], dtype=torch.float64))


def test_monte_carlo_targets_ce_use_exponentiated_target():
    terminal = spo_loss(**batch(), objective="terminal", loss="ce")
    out = spo_loss(**batch(), objective="terminal", loss="ce", **mc_inputs())
    x = lambda s: s + (1 - s) * math.exp(-2)  # noqa: E731
    mc0 = ce(-0.2, x(0.5)) + ce(0.1, x(1.0))
    mc1 = ce(-1.2, x(0.2))
    torch.testing.assert_close(out.per_sequence - terminal.per_sequence, torch.tensor([mc0, mc1], dtype=torch.float64))


def test_batch_loss_is_mean_of_per_sequence_sums():
    whole = spo_loss(**batch(), objective="reverse_q", loss="ce")
    singles = []
    for i in range(2):
        b = {k: (v[i : i + 1] if isinstance(v, torch.Tensor) else v) for k, v in batch().items()}
        singles.append(spo_loss(**b, objective="reverse_q", loss="ce").loss)
    assert whole.loss.item() == pytest.approx(sum(s.item() for s in singles) / 2)


# ---------------------------------------------------------------- gradients


def random_batch(seed: int, batch_size: int = 3, length: int = 5):
    """Float64 inputs whose Q stays well below 0 (ℓ̂ ≈ −1), so the CE loss is smooth there."""
    g = torch.Generator().manual_seed(seed)
    ref = -torch.rand(batch_size, length, generator=g, dtype=torch.float64) - 0.5
    policy = ref + 0.1 * torch.randn(batch_size, length, generator=g, dtype=torch.float64)
    lengths = torch.tensor([length, length - 2, 1])[:batch_size]
    mask = torch.arange(length)[None, :] < lengths[:, None]
    reward = torch.tensor([0.0, -1.0, -1.0], dtype=torch.float64)[:batch_size]
    q0 = torch.full((batch_size,), -0.5, dtype=torch.float64)
    return policy, dict(ref_logprobs=ref, mask=mask, reward=reward, q0=q0, beta=0.5)


@pytest.mark.parametrize(
    "objective, loss", [("terminal", "squared"), ("terminal", "ce"), ("advantage", "ce")]
)
@pytest.mark.parametrize("with_mc", [False, True])
def test_gradients_match_finite_differences(objective, loss, with_mc):
    policy, kwargs = random_batch(0)
    mc = {}
    if with_mc:
        mc = dict(
            mc_positions=torch.tensor([[2, 5], [1, 0], [1, 1]]),
            mc_success=torch.tensor([[0.3, 0.9], [0.6, 0.1], [0.5, 0.5]], dtype=torch.float64),
            mc_mask=torch.tensor([[True, True], [True, True], [True, False]]),
        )
    policy.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda p: spo_loss(p, **kwargs, objective=objective, loss=loss, **mc).loss, (policy,)
    )


@pytest.mark.parametrize("loss", ["squared", "ce"])
def test_reverse_q_gradient_treats_targets_as_constants(loss):
    """Autograd of reverse_q equals finite differences of Σ_t L(Q_t, R_t) with R_t frozen at the current point."""
    policy, kwargs = random_batch(1)
    ref, mask, reward, q0, beta = (kwargs[k] for k in ("ref_logprobs", "mask", "reward", "q0", "beta"))
    with torch.no_grad():
        q = cumulative_q(policy, ref, q0, mask, beta)
        frozen_targets = q[:, 1:] + (reward - q[:, -1])[:, None]

    def frozen_target_loss(p):
        q_t = cumulative_q(p, ref, q0, mask, beta)[:, 1:]
        if loss == "squared":
            terms = (q_t - frozen_targets) ** 2
        else:
            terms = log_prob_cross_entropy(q_t / beta, torch.exp(frozen_targets.clamp(max=0) / beta))
        return (terms * mask).sum(dim=1).mean()

    policy.requires_grad_(True)
    spo_loss(policy, **kwargs, objective="reverse_q", loss=loss).loss.backward()
    assert torch.autograd.gradcheck(frozen_target_loss, (policy.detach().clone().requires_grad_(True),))
    expected = torch.autograd.grad(frozen_target_loss(policy), policy)[0]
    torch.testing.assert_close(policy.grad, expected)


def test_log1mexp_gradient_and_accuracy_on_both_branches():
    x = torch.tensor([-30.0, -2.0, -0.8, -0.6, -0.1, -1e-3], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(log1mexp, (x,))
    # float32 must stay accurate where the naive log(1 − exp(x)) cancels (near 0) or rounds to 0 (far below)
    points = [-1e-7, -1e-3, -0.5, -0.7, -1.0, -20.0, -100.0]
    reference = [math.log(-math.expm1(v)) for v in points]
    got = log1mexp(torch.tensor(points, dtype=torch.float32)).double()
    torch.testing.assert_close(got, torch.tensor(reference, dtype=torch.float64), rtol=1e-5, atol=1e-12)


def test_ce_clip_is_straight_through():
    """ℓ̂ ≥ 0: the forward value is that at −eps, the gradient is the derivative evaluated at −eps."""
    eps, x = 1e-3, 0.3
    logp = torch.tensor([0.5, 0.0, -eps / 2], dtype=torch.float64, requires_grad=True)
    value = log_prob_cross_entropy(logp, torch.full_like(logp, x), eps=eps)
    at_clip = -(1 - x) * math.log(-math.expm1(-eps))
    relu_part = torch.tensor([0.0, 0.0, x * eps / 2], dtype=torch.float64)
    torch.testing.assert_close(value, at_clip + relu_part)
    value.sum().backward()
    d_log1mexp = (1 - x) * math.exp(-eps) / -math.expm1(-eps)  # d/dℓ of −(1−x)·log(1 − e^ℓ) at ℓ = −eps
    expected = torch.tensor([d_log1mexp, d_log1mexp, d_log1mexp - x], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)
    assert torch.isfinite(logp.grad).all()


def test_the_trainers_default_clip_keeps_one_wrong_sequence_from_outweighing_a_batch():
    """A wrong rollout whose Q_T/β reached the clip (a prompt whose Q̂0 is 0, a policy that already favours it) gets
    ~1/ce_eps per token; a correct lake row far below its target gets 1. At the old 1e-6 one such sequence was a
    million correct ones (gradient norms ~1e6 in 2–16 of 40 steps); the default bounds it near 20."""
    from spo_lake.rl.config import TrainConfig

    eps = TrainConfig().algorithm.ce_eps

    def per_token_gradient(reward: float, q0: float, eps: float) -> float:
        policy = torch.zeros(1, 4, dtype=torch.float64, requires_grad=True)
        spo_loss(policy, torch.zeros(1, 4, dtype=torch.float64), torch.ones(1, 4, dtype=torch.bool),
                 torch.tensor([reward], dtype=torch.float64), torch.tensor([q0], dtype=torch.float64), PAPER_BETA,
                 loss="ce", eps=eps).loss.backward()
        return policy.grad.abs().max().item()

    correct_far_below = per_token_gradient(0.0, -1.0, eps)  # a lake solution to a prompt π0 never solved
    wrong_at_clip = per_token_gradient(-1.0, 0.0, eps)
    assert correct_far_below == pytest.approx(1.0)
    assert wrong_at_clip <= 25 * correct_far_below
    assert per_token_gradient(-1.0, 0.0, 1e-6) > 1e5  # what the clip at 1e-6 gave


def test_ce_loss_is_minimised_at_the_target_probability():
    logp = torch.linspace(-6, -0.01, 2000, dtype=torch.float64)
    for x in (0.05, 0.5, 0.9):
        best = logp[log_prob_cross_entropy(logp, torch.full_like(logp, x)).argmin()]
        assert best.item() == pytest.approx(math.log(x), abs=5e-3)


# ---------------------------------------------------------------- padding, dtypes


@pytest.mark.parametrize(
    "objective, loss", [("terminal", "squared"), ("terminal", "ce"), ("reverse_q", "squared"),
                        ("reverse_q", "ce"), ("advantage", "ce")]
)
def test_extra_padding_changes_nothing(objective, loss):
    policy, kwargs = random_batch(2)
    mc = dict(
        mc_positions=torch.tensor([[2], [3], [1]]),
        mc_success=torch.tensor([[0.3], [0.6], [0.5]], dtype=torch.float64),
        mc_mask=torch.tensor([[True], [True], [False]]),
    )
    policy.requires_grad_(True)
    base = spo_loss(policy, **kwargs, objective=objective, loss=loss, **mc)
    base.loss.backward()

    pad = 4
    garbage = torch.tensor([float("nan"), float("-inf"), 7.0, -3.0], dtype=torch.float64).expand(3, pad)
    padded_policy = torch.cat([policy.detach(), garbage], dim=1).requires_grad_(True)
    padded = dict(kwargs)
    padded["ref_logprobs"] = torch.cat([kwargs["ref_logprobs"], garbage.flip(1)], dim=1)
    padded["mask"] = torch.cat([kwargs["mask"], torch.zeros(3, pad, dtype=torch.bool)], dim=1)
    padded_mc = dict(
        mc_positions=torch.cat([mc["mc_positions"], torch.full((3, 2), 50)], dim=1),
        mc_success=torch.cat([mc["mc_success"], torch.full((3, 2), 2.0, dtype=torch.float64)], dim=1),
        mc_mask=torch.cat([mc["mc_mask"], torch.zeros(3, 2, dtype=torch.bool)], dim=1),
    )
    out = spo_loss(padded_policy, **padded, objective=objective, loss=loss, **padded_mc)
    out.loss.backward()
    torch.testing.assert_close(out.loss, base.loss)
    torch.testing.assert_close(out.kl_estimate, base.kl_estimate)
    torch.testing.assert_close(padded_policy.grad[:, :5], policy.grad)
    assert (padded_policy.grad[:, 5:] == 0).all()


def test_low_precision_inputs_are_upcast():
    b = batch(dtype=torch.bfloat16)
    out = spo_loss(**b)
    assert out.loss.dtype == torch.float32


# ---------------------------------------------------------------- Q̂0 and Theorem 2.2


def test_q0_from_counts():
    assert q0_from_counts(800, 0, PAPER_BETA) == pytest.approx(-1.0)
    assert q0_from_counts(800, 800, PAPER_BETA) == 0.0
    # the paper's β makes e^{−1/β} = 1e-5
    assert q0_from_counts(800, 400, PAPER_BETA) == pytest.approx(PAPER_BETA * math.log(0.5 + 0.5e-5))
    # S0 = 0 stays exactly −1 even where e^{−1/β} underflows
    assert q0_from_counts(10, 0, 1e-4) == pytest.approx(-1.0)
    q0 = q0_from_counts(torch.tensor([4, 4]), torch.tensor([1, 3]), 0.5)
    assert q0.dtype == torch.get_default_dtype()
    expected = [0.5 * math.log(s + (1 - s) * math.exp(-2)) for s in (0.25, 0.75)]
    torch.testing.assert_close(q0, torch.tensor(expected))
    # a Beta(a, a) prior: S0 = (s + a) / (n + 2a), so no success in 16 samples is not "never"
    assert q0_from_counts(16, 0, PAPER_BETA, prior=0.5) == pytest.approx(
        PAPER_BETA * math.log(0.5 / 17 + (1 - 0.5 / 17) * 1e-5))
    assert q0_from_counts(800, 400, PAPER_BETA, prior=3.0) == q0_from_counts(800, 400, PAPER_BETA)
    with pytest.raises(ValueError, match="prior >= 0"):
        q0_from_counts(4, 1, PAPER_BETA, prior=-1.0)


def test_bellman_identity_of_theorem_2_2_by_enumeration():
    """Q_t = β·log Σ_a π0(a|prefix)·exp(Q_{t+1}(prefix, a)/β) for every prefix, any θ (vocab 4, length 3)."""
    vocab, length, beta = 4, 3, PAPER_BETA
    g = torch.Generator().manual_seed(3)
    prefixes = [p for t in range(length) for p in itertools.product(range(vocab), repeat=t)]
    policy_table = {p: torch.log_softmax(2 * torch.randn(vocab, generator=g, dtype=torch.float64), 0) for p in prefixes}
    ref_table = {p: torch.log_softmax(2 * torch.randn(vocab, generator=g, dtype=torch.float64), 0) for p in prefixes}
    sequences = list(itertools.product(range(vocab), repeat=length))

    def token_logprobs(table):
        return torch.stack([torch.stack([table[s[:t]][s[t]] for t in range(length)]) for s in sequences])

    q0 = torch.full((len(sequences),), -0.37, dtype=torch.float64)
    mask = torch.ones(len(sequences), length, dtype=torch.bool)
    q = cumulative_q(token_logprobs(policy_table), token_logprobs(ref_table), q0, mask, beta)
    q_of = {s[: t]: q[i, t] for i, s in enumerate(sequences) for t in range(length + 1)}
    for prefix in prefixes:
        children = torch.stack([q_of[prefix + (a,)] for a in range(vocab)])
        soft_backup = beta * torch.logsumexp(ref_table[prefix] + children / beta, dim=0)
        torch.testing.assert_close(soft_backup, q_of[prefix])
        # equivalently S_{π0}[A] = 0 for A = β(log πθ − log π0) at this prefix
        advantage = beta * (policy_table[prefix] - ref_table[prefix])
        assert abs(beta * torch.logsumexp(ref_table[prefix] + advantage / beta, dim=0).item()) < 1e-12


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(objective="advantage", loss="squared"), "needs loss='ce'"),
        (dict(objective="forward"), "unknown SPO objective"),
        (dict(loss="l1"), "unknown SPO loss"),
        (dict(beta=0.0), "beta must be > 0"),
        (dict(mask=torch.tensor([[False, True, True], [True, True, False]])), "left-aligned"),
        (dict(reward=torch.zeros(3)), "reward and q0 must have shape"),
        (dict(ref_logprobs=torch.zeros(2, 4)), "must share shape"),
        (dict(mc_positions=torch.zeros(2, 1, dtype=torch.long)), "give all of"),
        (dict(mc_positions=torch.tensor([[4], [0]]), mc_success=torch.ones(2, 1), mc_mask=torch.ones(2, 1).bool()),
         "0..sequence length"),
        (dict(mc_positions=torch.tensor([[1], [0]]), mc_success=torch.tensor([[1.5], [0]]),
              mc_mask=torch.ones(2, 1).bool()), r"\[0, 1\]"),
    ],
)
def test_bad_input_raises_one_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        spo_loss(**{**batch(), **change})


def test_q0_from_counts_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= n_success <= n"):
        q0_from_counts(10, 11, PAPER_BETA)
    with pytest.raises(ValueError, match="n > 0"):
        q0_from_counts(0, 0, PAPER_BETA)
