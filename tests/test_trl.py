"""One real TRL step each for SFT, DPO and GRPO on the built-in tiny model, from `spolake export --shape` datasets
and the `spo_lake.rewards` verifier: the claim that exports are TRL-loadable stays true as TRL changes."""
from __future__ import annotations

import pytest
import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer

from spo_lake import Lake, export, ingest, verifier_reward
from spo_lake.tasks import SandboxOptions

# Small and fast on CPU: one step of batch 2, short sequences, no saving, no reporting.
COMMON = dict(max_steps=1, per_device_train_batch_size=2, learning_rate=1e-3, use_cpu=True, report_to=[],
              save_strategy="no", logging_steps=1, seed=0, dataloader_num_workers=0, disable_tqdm=True)


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    from spo_lake.ingest.datasets import ingest_dataset

    lake = Lake.init(tmp_path_factory.mktemp("trl") / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)  # solver solutions: passing trajectories
    ingest(lake, [{"prompt_id": f"countdown/0/{i}", "response": " 1+1", "reward": -1} for i in range(4)],
           source="reference", model="m")
    lake.snapshot("trl")
    return lake


@pytest.fixture
def model_and_tokenizer(fast_model_dir):
    return AutoModelForCausalLM.from_pretrained(fast_model_dir), AutoTokenizer.from_pretrained(fast_model_dir)


def snapshot_weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def changed(model, before: list[torch.Tensor]) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_one_sft_step_from_the_sft_export(lake, model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    data = export(lake, "trl", "sft").to_dataset()
    assert len(data) >= 4
    before = snapshot_weights(model)
    args = trl.SFTConfig(output_dir=str(tmp_path), max_length=128, **COMMON)
    out = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer).train()
    assert out.global_step == 1 and out.training_loss > 0 and changed(model, before)


def test_one_dpo_step_from_the_dpo_export(lake, model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    data = export(lake, "trl", "dpo").to_dataset()
    assert len(data) >= 2
    before = snapshot_weights(model)
    args = trl.DPOConfig(output_dir=str(tmp_path), max_length=128, **COMMON)
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    out = trainer.train()
    assert out.global_step == 1 and changed(model, before)
    logged = trainer.state.log_history[0]
    assert abs(logged["loss"] - 0.6931) < 0.05  # log(2): policy == reference at the first step


def test_one_grpo_step_rewarded_by_the_sandboxed_verifier(lake, model_and_tokenizer, tmp_path):
    model, tokenizer = model_and_tokenizer
    data = export(lake, "trl", "prompt").to_dataset()
    reward = verifier_reward(SandboxOptions(timeout_s=5.0))
    judged: list[list[float | None]] = []

    def spo_lake_verifier(**kwargs):  # the real reward function; records what it returned
        judged.append(reward(**kwargs))
        return judged[-1]

    args = trl.GRPOConfig(output_dir=str(tmp_path), num_generations=2, max_completion_length=12,
                          temperature=1.0, **COMMON)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=spo_lake_verifier, args=args, train_dataset=data,
                              processing_class=tokenizer)
    out = trainer.train()
    assert out.global_step == 1
    rewards = [r for call in judged for r in call]
    assert len(rewards) == 2 and set(rewards) <= {0.0, -1.0}
    assert trainer.state.log_history[0]["rewards/spo_lake_verifier/mean"] == pytest.approx(sum(rewards) / 2)
