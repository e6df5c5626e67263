"""The built-in tiny model: a useful π0 (success in range, its sign-off habit), deterministic builds, the CoT
variant's format."""
from __future__ import annotations

import json
import shutil
from fractions import Fraction

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.tiny import build_tiny_model
from spo_lake.models.tiny_data import SIGN_OFF, exact_steps, reasoning_line, training_pairs
from spo_lake.tasks.base import Problem, SandboxOptions
from spo_lake.tasks.countdown import TASK, check_structure, extract_answer, make_problems, needs_product

HELD_OUT_SEED = 20_250_101  # not a training seed: those are offset by TRAIN_SEED_OFFSET
SMALL = dict(steps=3, n_problems=30, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2)


def value(expression: str) -> Fraction:
    return exact_steps(expression)[0]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
def test_success_rate_at_temperature_one_is_a_useful_pi0(tiny_model_dir):
    prompts, _ = make_problems(200, seed=HELD_OUT_SEED)
    problems = [Problem.from_row(p) for p in prompts]
    policy = TransformersPolicy.from_pretrained(str(tiny_model_dir), batch_size=200)
    results = policy.sample([p.prompt for p in problems], n=2, temperature=1.0, top_p=1.0, max_new_tokens=32, seed=0)
    verdicts = TASK.verify_many([(problems[r.prompt_index], r.text) for r in results], SandboxOptions())
    # The sign-off habit (about half the answers at the default 0.5) always fails: the answer must be the last line.
    signed = [r.text.strip().endswith(SIGN_OFF) for r in results]
    assert 0.3 <= sum(signed) / len(results) <= 0.7
    assert not any(v.passed for v, s in zip(verdicts, signed) if s)
    # Without it, imperfect yet competent: success in range, mostly well-formed answers, and diverse ones.
    plain = [(r, v) for (r, v), s in zip(zip(results, verdicts), signed) if not s]
    success = sum(v.passed for _, v in plain) / len(plain)
    assert 0.10 <= success <= 0.60, f"success rate without a sign-off {success:.2f}"
    legal = sum(check_structure(extract_answer(r.text), problems[r.prompt_index].tests["numbers"]).ok for r, _ in plain)
    assert legal / len(plain) >= 0.35
    assert len({(r.prompt_index, r.text) for r in results}) >= 0.75 * len(results)


def test_sign_offs_make_up_the_configured_share_and_follow_the_answer():
    pairs = training_pairs(300, seed=5, style="direct", near_miss_fraction=0.0, sign_off_fraction=0.4)
    signed = [r for _, r in pairs if r.endswith("\n" + SIGN_OFF)]
    assert 0.33 <= len(signed) / len(pairs) <= 0.47
    assert all(r.count("\n") == 1 for r in signed)  # the answer itself, then the sign-off line
    assert not any(SIGN_OFF in r for _, r in training_pairs(100, seed=5, style="cot", near_miss_fraction=0.1))


def _numbers_and_target(prompt: str) -> tuple[list[int], int]:
    numbers = [int(x) for x in prompt.split("numbers ")[1].split(" (")[0].split(", ")]
    return numbers, int(prompt.split("equal to ")[1].split(".")[0])


def test_a_skill_gap_mix_leaves_products_out_or_makes_them_rare():
    never = training_pairs(150, seed=5, style="direct", near_miss_fraction=0.1, product_fraction=0.0)
    assert len(never) == 150 * 4 and not any(set("*/") & set(r) for _, r in never)
    assert not any(needs_product(*_numbers_and_target(prompt)) for prompt, _ in never)
    rare = training_pairs(600, seed=5, style="direct", near_miss_fraction=0.0, product_fraction=0.05)
    with_products = {prompt for prompt, _ in rare if needs_product(*_numbers_and_target(prompt))}
    # ~29 % of drawn problems need * or /; kept at 5 %, they are ~2 % of the mix, and only they multiply
    assert 0.005 <= len(with_products) / 600 <= 0.04
    assert all(prompt in with_products for prompt, r in rare if set("*/") & set(r))


# trains a transformer and asserts what it learnt
@pytest.mark.integration
def test_a_skill_gap_pi0_gives_products_far_less_probability_than_sums(tmp_path):
    """The gap measured on the model itself, by scoring (no sampling): for held-out problems that need * or /, the
    solver's answer costs π0 (trained without them) many nats more than the same answer with + and - in their
    place. bench/skill_gap.py measures success rates by problem group."""
    model = build_tiny_model(tmp_path / "gap", steps=150, n_problems=300, hidden_size=64, intermediate_size=128,
                             num_layers=2, num_heads=2, sign_off_fraction=0.0, product_fraction=0.0)
    policy = TransformersPolicy.from_pretrained(str(model))
    prompts, humans = make_problems(40, seed=HELD_OUT_SEED, solutions_per_prompt=1)
    skill = {p["prompt_id"]: p for p in prompts if needs_product(p["tests"]["numbers"], p["tests"]["target"])}
    answers = [(skill[h["prompt_id"]]["prompt"], h["response"]) for h in humans if h["prompt_id"] in skill]
    assert len(answers) >= 5
    swapped = [(prompt, answer.replace("*", "+").replace("/", "-")) for prompt, answer in answers]
    totals = []
    for pairs in (answers, swapped):
        ids = [policy.tokenize_response(prompt, answer) for prompt, answer in pairs]
        totals.append([sum(lps) for lps in policy.score([p for p, _ in ids], [r for _, r in ids])])
    gaps = [plus - product for product, plus in zip(*totals)]
    assert sum(gaps) / len(gaps) > 3.0, gaps


def test_builds_are_deterministic_for_a_seed(tmp_path):
    first = build_tiny_model(tmp_path / "a", seed=1, **SMALL)
    second = build_tiny_model(tmp_path / "b", seed=1, **SMALL)
    other = build_tiny_model(tmp_path / "c", seed=2, **SMALL)
    weights = [AutoModelForCausalLM.from_pretrained(d).state_dict() for d in (first, second, other)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()
    info = json.loads((first / "tiny_config.json").read_text())
    tied = {k: w for k, w in weights[0].items() if k != "lm_head.weight"}  # lm_head shares the embedding
    assert info["config"]["seed"] == 1 and info["parameters"] == sum(w.numel() for w in tied.values())


def test_near_misses_make_up_the_configured_share_of_the_training_mix():
    pairs = training_pairs(300, seed=5, style="direct", near_miss_fraction=0.3)
    correct = 0
    for prompt, response in pairs:
        numbers = [int(x) for x in prompt.split("numbers ")[1].split(" (")[0].split(", ")]
        target = int(prompt.split("equal to ")[1].split(".")[0])
        legal = check_structure(response, numbers).ok
        try:
            correct += legal and value(response) == target
        except ZeroDivisionError:
            pass
    assert 0.62 <= correct / len(pairs) <= 0.78


def test_cot_responses_reason_first_and_answer_on_the_last_line(tmp_path):
    for _, response in training_pairs(50, seed=3, style="cot", near_miss_fraction=0.3):
        if "\n" not in response:  # a lone number (a near-miss) has no steps to show
            assert response.isdigit()
            continue
        reasoning, answer = response.rsplit("\n", 1)
        assert extract_answer(response) == answer
        last_step = reasoning.split(", ")[-1]
        if "." not in last_step:  # integer results: the reasoning's last result is the expression's value
            assert Fraction(last_step.split("=")[-1]) == value(answer)
    assert reasoning_line("(12+4)*2") == "12+4=16, 16*2=32"
    assert reasoning_line("3/(2-2)") is None
    built = build_tiny_model(tmp_path / "cot", style="cot", **SMALL)
    assert json.loads((built / "tiny_config.json").read_text())["config"]["style"] == "cot"
    assert AutoTokenizer.from_pretrained(built).eos_token == "</s>"


def test_unknown_settings_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="style"):
        build_tiny_model(tmp_path / "x", style="essay")
    with pytest.raises(ValueError, match="unknown tiny-model setting.*width"):
        build_tiny_model(tmp_path / "x", width=3)
