"""SPO's mechanisms (TrainConfig.mechanisms; issue 40 §2): each checked on the quantity it changes — the lake-bounded
Q̂0 of a prompt π0 never solved, the push-down of a wrong answer, LUFFY's token weights, the divergence guard — on
the tiny model and a real lake, and the ablation bench's dry run."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
from spo_lake.pipelines.refprobs import refprobs
from spo_lake.rl.config import load_config
from spo_lake.rl.data import solution_log_mass
from spo_lake.rl.examples import Example, collate
from spo_lake.rl.losses import lake_bounded_q0, luffy_token_weights, negative_push, spo_loss
from spo_lake.rl.run import read_metrics
from spo_lake.rl.scoring import response_log_probs
from spo_lake.rl.trainer import Trainer
from spo_lake.scores import PAPER_BETA, q0_from_counts

ROOT = Path(__file__).resolve().parents[2]
BETA = PAPER_BETA


@pytest.fixture(scope="module")
def policy(fast_model_dir) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(str(fast_model_dir))


@pytest.fixture(scope="module")
def lake(tmp_path_factory, policy) -> Lake:
    """6 countdown problems with solver solutions, Q0 counts of π0 (2 samples: the fast model solves none) and the
    solutions' cached π0 log-probs, pinned as `base`."""
    lake = Lake.init(tmp_path_factory.mktemp("mech") / "lake")
    ingest_dataset(lake, "countdown", None, n=6, seed=0)
    q0(lake, policy, k=2, max_new_tokens=16, beta=BETA, show_progress=False)
    refprobs(lake, policy, where="t.source = 'human'", show_progress=False)
    lake.snapshot("base")
    return lake


def config(model, run_dir, *extra: str):
    return load_config(None, [
        f'model="{model}"', f'run_dir="{run_dir}"', 'snapshot="base"', "steps=1", "batch_size=8", "lr=1e-3",
        "max_new_tokens=16", "judge_workers=1", "checkpoint_every=0", "eval_every=0", 'streams.online.kind="online"',
        "streams.online.fraction=0.5", 'streams.human.kind="lake"', "streams.human.fraction=0.5",
        'streams.human.where="passed AND source = \'human\'"', *extra])


def test_a_never_solved_prompt_with_a_known_correct_lake_row_gets_the_lake_bounded_q0(lake, policy):
    never = lake.sql("""SELECT prompt_id FROM "values" WHERE trajectory_id IS NULL AND n_success = 0""",
                     "base").column("prompt_id").to_pylist()
    masses = solution_log_mass(lake, "base", policy.model_id)
    assert never and set(never) <= set(masses)  # π0 never solved them; the lake holds a solution to each
    pid = never[0]
    # the mass, independently: π0 scores the prompt's distinct correct solutions here
    rows = lake.sql(f"""SELECT DISTINCT t.response_text, p.prompt FROM trajectories t
                        JOIN prompts p USING (prompt_id) JOIN evaluations e USING (trajectory_id)
                        WHERE e.passed AND t.prompt_id = '{pid}'""", "base").to_pylist()
    pairs = [policy.tokenize_response(r["prompt"], r["response_text"]) for r in rows]
    scored = [sum(lp) for lp in policy.score([p for p, _ in pairs], [r for _, r in pairs])]
    assert masses[pid] == pytest.approx(math.log(sum(math.exp(s) for s in scored)), abs=1e-3)

    mc = q0_from_counts(2, 0, BETA)
    assert mc == pytest.approx(-1.0)
    bounded = float(lake_bounded_q0(torch.tensor([mc]), torch.tensor([masses[pid]]), BETA))
    m = math.exp(masses[pid])
    assert bounded == pytest.approx(BETA * math.log(m + (1 - m) * math.exp(-1 / BETA)), rel=1e-6) and bounded > mc
    # a wrong answer's target log-ratio (r − Q̂0)/β was 0; now it asks for less than π0 gives
    assert (-1 - bounded) / BETA < 0
    # a prompt π0 solves more often than the lake's mass says keeps its Monte-Carlo Q̂0; no solution: unchanged
    assert float(lake_bounded_q0(torch.tensor([-0.01]), torch.tensor([masses[pid]]), BETA)) == pytest.approx(-0.01)
    assert float(lake_bounded_q0(torch.tensor([mc]), torch.tensor([-math.inf]), BETA)) == mc


def test_the_trainer_trains_with_the_lake_bounded_q0_only_when_asked(lake, fast_model_dir, tmp_path):
    solved = lake.sql('SELECT max(n_success) AS s FROM "values" WHERE trajectory_id IS NULL', "base").column("s")[0]
    assert solved.as_py() == 0  # so every Q̂0 from π0's samples is −1, and a mean above it is the bound's doing
    records = {}
    for on in (False, True):  # off: also without the default divergence guard, which then logs nothing
        extra = [f"q0_lake_bound={str(on).lower()}"] + ([] if on else ["log_ratio_cap=0.0"])
        trainer = Trainer(config(fast_model_dir, tmp_path, f'run_name="b{on}"', *extra), lake, show_progress=False)
        trainer.train()
        (records[on],) = read_metrics(trainer.run_dir)
    assert "q0" not in records[False] and records[True]["q0"] > -1.0 + 1e-3
    assert "guarded" not in records[False] and 0 <= records[True]["guarded"] <= 1  # the guard is on by default


def _wrong_online_batch(lake, policy):
    """A wrong answer of π0 to a never-solved prompt, as a one-sequence batch with its π0 log-probs."""
    prompt = lake.sql("SELECT prompt FROM prompts ORDER BY prompt_id", "base").column("prompt")[0].as_py()
    prompt_ids = policy.encode_prompt(prompt)
    response = policy.tokenizer.encode(" 1 + 2", add_special_tokens=False)
    example = Example(stream=0, prompt_id="p", prompt_ids=prompt_ids, response_ids=response, reward=-1.0, q0=-1.0)
    return collate([example], policy.pad_id)


def test_negative_push_lowers_a_wrong_answers_log_probability_and_fades_below_pi0(lake, fast_model_dir):
    policy = TransformersPolicy.from_pretrained(str(fast_model_dir))  # a copy this test may update
    batch = _wrong_online_batch(lake, policy)
    with torch.no_grad():
        ref = response_log_probs(policy.model, batch)
    grads = {}
    for weight in (0.0, 1.0):
        policy.model.zero_grad()
        lp = response_log_probs(policy.model, batch)
        spo_loss(lp, ref, batch.response_mask, batch.reward, batch.q0, BETA, loss="ce", eps=0.05,
                 negative_weight=weight).loss.backward()
        grads[weight] = [p.grad.clone() for p in policy.model.parameters() if p.grad is not None]
    # without the push, SPO's target log-ratio (r − Q̂0)/β = 0 leaves the wrong answer (nearly) alone
    assert sum(g.norm() for g in grads[0.0]) < 1e-3 * sum(g.norm() for g in grads[1.0])
    optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.05)
    before = float(response_log_probs(policy.model, batch).sum())
    for _ in range(3):
        optimizer.zero_grad()
        lp = response_log_probs(policy.model, batch)
        spo_loss(lp, ref, batch.response_mask, batch.reward, batch.q0, BETA, loss="ce", eps=0.05,
                 negative_weight=1.0).loss.backward()
        optimizer.step()
    assert float(response_log_probs(policy.model, batch).sum()) < before - 0.1
    # bounded: the weight is min(1, πθ/π0), so 5 nats below π0 the push is e^-5 of its full size
    ell = torch.tensor([0.0, -5.0], requires_grad=True)
    negative_push(ell, torch.tensor([True, True]), 1.0).sum().backward()
    assert ell.grad.tolist() == pytest.approx([1.0, math.exp(-5.0)])
    assert negative_push(torch.tensor([-3.0]), torch.tensor([False]), 1.0).item() == 0.0  # correct answers: no push


def test_luffy_weights_scale_each_lake_tokens_gradient_and_peak_at_gamma(lake, policy):
    p = torch.tensor([1e-4, 0.1, 0.5, 1.0])
    w = luffy_token_weights(p.log())
    assert w.tolist() == pytest.approx([4 * 0.1 * x / (x + 0.1) ** 2 for x in p.tolist()]) and w[1] == pytest.approx(1)
    batch = _wrong_online_batch(lake, policy)
    batch.reward = torch.tensor([0.0])
    with torch.no_grad():
        ref = response_log_probs(policy.model, batch) - 0.5
    lp = response_log_probs(policy.model, batch).detach()
    grads = []
    for weights in (None, luffy_token_weights(lp)):
        x = lp.clone().requires_grad_(True)
        spo_loss(x, ref, batch.response_mask, batch.reward, batch.q0, BETA, objective="reverse_q", loss="ce",
                 token_weights=weights).loss.backward()
        grads.append(x.grad)
    assert torch.allclose(grads[1], grads[0] * luffy_token_weights(lp)) and not torch.allclose(grads[1], grads[0])


def test_the_divergence_guard_drops_far_off_policy_sequences_from_the_loss():
    policy = torch.tensor([[-0.1, -0.2], [-0.1, -0.2]], requires_grad=True)
    ref = torch.tensor([[-0.2, -0.3], [-30.0, -40.0]])  # sequence 1: 69.7 nats above π0, a diverged sample
    args = (ref, torch.ones(2, 2, dtype=torch.bool), torch.tensor([-1.0, -1.0]), torch.tensor([-1.0, -1.0]), BETA)
    out = spo_loss(policy, *args, loss="ce", eps=0.05, log_ratio_cap=23.0)
    out.loss.backward()
    assert out.guarded == 1 and policy.grad[1].abs().sum() == 0 and policy.grad[0].abs().sum() > 0
    assert out.per_sequence[1] == 0
    unguarded = spo_loss(policy, *args, loss="ce", eps=0.05)
    assert unguarded.guarded == 0 and unguarded.per_sequence[1] > 0


def test_mechanisms_are_spo_options_and_checked(fast_model_dir, tmp_path):
    with pytest.raises(ValueError, match="negative_weight"):
        config(fast_model_dir, tmp_path, "negative_weight=-1.0")
    with pytest.raises(ValueError, match="SPO options"):
        load_config(None, [f'model="{fast_model_dir}"', 'algorithm="ppo"', "luffy_lake_tokens=true",
                           'streams.online.kind="online"', "streams.online.fraction=1.0"])


def test_the_ablation_bench_dry_run_validates_every_arm(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "spo_mechanisms.py"), "--out", str(tmp_path),
                           "--dry-run", "--seeds", "0", "3", "--lr", "3e-4", "--full"],
                          capture_output=True, text=True, check=True, cwd=ROOT)
    lines = done.stdout.splitlines()
    assert len(lines) == 2 * 6 and all(line.endswith(" valid") for line in lines)
    assert '"log_ratio_cap": 0.0' in done.stdout and not (tmp_path / "seed-0").exists()  # built nothing
