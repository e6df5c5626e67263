"""Training data: padding layout, stream shares, and lake streams read from a pinned snapshot."""
import math

import pytest
import torch

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.scripted import ScriptedPolicy
from spo_lake.models.tokens import tokenizer_id, trajectory_token_ids
from spo_lake.pipelines.dedup import dedup
from spo_lake.rl.config import StreamConfig, TrainConfig, stream_counts, validate
from spo_lake.rl.data import LakeStream, StreamSettings, online_prompts
from spo_lake.rl.examples import Example, collate
from spo_lake.rl.mixer import Mixer
from spo_lake.scores import q0_from_counts
from tests.helpers import add_responses

BETA = 0.25


def example(prompt, response, stream=0, **kw) -> Example:
    return Example(stream=stream, prompt_id="p", prompt_ids=prompt, response_ids=response, reward=0.0, q0=-0.5, **kw)


def test_collate_left_pads_prompts_so_every_response_starts_at_the_same_column():
    batch = collate([example([1, 2, 3], [4, 5], mc_positions=[1, 2], mc_success=[0.5, 1.0]),
                     example([6], [7, 8, 9], ref_logprobs=[-1.0, -2.0, -3.0], behavior_logprobs=[-0.5] * 3)], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 0], [0, 0, 6, 7, 8, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.response_ids.tolist() == [[4, 5, 0], [7, 8, 9]]
    assert batch.response_mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.ref_cached.tolist() == [False, True] and batch.ref_logprobs[1].tolist() == [-1.0, -2.0, -3.0]
    assert batch.has_behavior.tolist() == [False, True]
    assert batch.mc_positions.tolist() == [[1, 2], [0, 0]] and batch.mc_mask.tolist() == [[True, True], [False, False]]
    assert batch.tokens == 9
    sub = batch.rows(torch.tensor([1]))
    assert sub.input_ids.tolist() == [[0, 0, 6, 7, 8, 9]] and sub.reward.shape == (1,)


@pytest.mark.parametrize("fractions, batch_size, expected", [
    ([0.5, 0.5], 16, [8, 8]), ([0.5, 0.25, 0.25], 16, [8, 4, 4]), ([0.5, 0.25, 0.25], 6, [3, 2, 1]),
    ([1 / 3, 1 / 3, 1 / 3], 8, [3, 3, 2]),
])
def test_stream_counts_split_each_batch_by_fraction(fractions, batch_size, expected):
    streams = [StreamConfig(f"s{i}", "online" if i == 0 else "lake", f) for i, f in enumerate(fractions)]
    counts = stream_counts(TrainConfig.from_keys(model="m", batch_size=batch_size, streams=streams))
    assert counts == expected and sum(counts) == batch_size


def test_config_validation_names_the_bad_key():
    with pytest.raises(ValueError, match="fractions must sum to 1"):
        validate(TrainConfig.from_keys(model="m", streams=[StreamConfig("a", "online", 0.5)]))
    with pytest.raises(ValueError, match="PPO trains on online rollouts only"):
        validate(TrainConfig.from_keys(model="m", algorithm="ppo", streams=[StreamConfig("a", "lake", 1.0)]))
    with pytest.raises(ValueError, match="'advantage' needs loss 'ce'"):
        validate(TrainConfig.from_keys(model="m", objective="advantage", loss="squared"))


def test_grpo_config_validation():
    online, expert = StreamConfig("online", "online", 0.5), StreamConfig("expert", "lake", 0.5, "passed", inject=True)
    grpo = dict(model="m", algorithm="grpo", batch_size=16, samples_per_prompt=4)
    assert validate(TrainConfig.from_keys(**grpo, streams=[online, expert])).behaviour_interval == 1
    for bad, message in [
        (dict(streams=[online, StreamConfig("lake", "lake", 0.5)]), "GRPO trains on online groups"),
        (dict(samples_per_prompt=1), "group needs >= 2"),
        (dict(batch_size=10, samples_per_prompt=2, streams=[StreamConfig("online", "online", 0.6),
                                                           StreamConfig("expert", "lake", 0.4, inject=True)]),
         "multiple of the 3 groups"),
        (dict(sft_steps=3), "sft_steps > 0 and sft_where go together"),
        (dict(sft_steps=1000, sft_where="passed"), "sft_steps must lie in"),
        (dict(loss_type="bnpo"), "loss_type"), (dict(scale_rewards="rank"), "scale_rewards"),
    ]:
        with pytest.raises(ValueError, match=message):
            validate(TrainConfig.from_keys(**{**grpo, **bad}))
    for key, value in [("sft_steps", 2), ("grpo_kl_coef", 0.1)]:  # GRPO's keys do nothing elsewhere: refused
        with pytest.raises(ValueError, match=f"{key} .*grpo"):
            sft_where = "passed" if key == "sft_steps" else ""
            validate(TrainConfig.from_keys(model="m", **{key: value}, sft_where=sft_where))
    with pytest.raises(ValueError, match="`inject` streams are for"):
        validate(TrainConfig.from_keys(model="m", streams=[online, expert]))


# ---------------------------------------------------------------------------------------------- lake streams


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    return ScriptedPolicy.from_pretrained(str(scripted_model_dir))


@pytest.fixture(scope="module")
def lake(tmp_path_factory, policy) -> Lake:
    """6 countdown problems with solver solutions (imported verdicts), Q0 counts for 5 of them, cached π0
    log-probs for some trajectories and Monte-Carlo prefix estimates for one; then a snapshot `pinned`."""
    lake = Lake.init(tmp_path_factory.mktemp("data") / "lake")
    ingest_dataset(lake, "countdown", None, n=6, seed=3)
    pi0 = policy.model_id
    values = [{"prompt_id": f"countdown/3/{i}", "trajectory_id": None, "position": None, "model_id": pi0,
               "temperature": 1.0, "top_p": 1.0, "n": 10, "n_success": i} for i in range(5)]
    values.append({**values[0], "n": 4, "n_success": 4})  # smaller n: the larger count wins
    rows = lake.sql("SELECT t.*, p.* FROM trajectories t JOIN prompts p USING (prompt_id) "
                    "ORDER BY trajectory_id").to_pylist()
    tok = tokenizer_id(policy)
    cached = []
    for i, row in enumerate(rows[::2]):
        prompt_ids, response_ids, _ = trajectory_token_ids(policy, tok, row)
        backend, dtype = ("transformers", "bfloat16") if i == 0 else policy.precision  # one of another precision
        cached.append({"trajectory_id": row["trajectory_id"], "model_id": pi0, "tokenizer_id": tok,
                       "token_ids": response_ids, "logprobs": policy.score([prompt_ids], [response_ids])[0],
                       "backend": backend, "dtype": dtype})
    mc_row = next(r for r in rows if r["prompt_id"] == "countdown/3/1")
    # PTS also records S(0) and S(T) = 1 (n = 1) at the ends: only the searched positions between are MC targets
    end = len(trajectory_token_ids(policy, tok, mc_row)[1])
    values += [{"prompt_id": mc_row["prompt_id"], "trajectory_id": mc_row["trajectory_id"], "position": p,
                "model_id": pi0, "temperature": 1.0, "top_p": 1.0, "n": n, "n_success": s}
               for p, n, s in [(0, 10, 1), (1, 10, 3), (2, 10, 7), (end, 1, 1)]]
    lake.append_many({"values": values, "logprobs": cached})
    # The same program again, from another source: `spolake dedup` marks the later row a duplicate.
    add_responses(lake, [{"prompt_id": rows[0]["prompt_id"], "response": rows[0]["response_text"] + "  ",
                          "reward": 0.0}], source="reference")
    dedup(lake)
    lake.snapshot("pinned")
    ingest_dataset(lake, "countdown", None, n=8, seed=3)  # after the snapshot: must stay invisible
    lake.append("values", [{**values[1], "prompt_id": f"countdown/3/{i}"} for i in range(5, 8)])
    return lake


def make_stream(lake, policy, where="", seed=0, page_size=3, mc=False) -> LakeStream:
    settings = StreamSettings(policy.model_id, BETA, seed, max_response_tokens=64, page_size=page_size)
    return LakeStream(lake, "pinned", StreamConfig("lake", "lake", 1.0, where=where, mc=mc), 0, settings, policy)


def expected_ids(lake, where="TRUE") -> set[str]:
    rows = lake.sql(f"SELECT trajectory_id FROM trajectories t JOIN prompts p USING (prompt_id) WHERE {where}",
                    "pinned").column("trajectory_id").to_pylist()
    return set(rows)


def test_a_lake_stream_is_a_seeded_permutation_per_epoch_read_page_by_page(lake, policy):
    with_q0 = expected_ids(lake, "p.prompt_id <> 'countdown/3/5'")
    stream = make_stream(lake, policy)
    assert stream.size == len(with_q0) > 6  # prompt 5 has no Q0 counts at the snapshot; later rows are not there
    epoch = []
    for _ in with_q0:
        epoch += stream.take(1)
        assert len(stream._page) < 3  # never more than one page of rows in memory
    assert {e.trajectory_id for e in epoch} == with_q0 and len(epoch) == len(with_q0)
    second = stream.take(len(with_q0))
    assert {e.trajectory_id for e in second} == with_q0 and stream.epoch >= 1
    assert [e.trajectory_id for e in second] != [e.trajectory_id for e in epoch]  # a fresh permutation

    again = make_stream(lake, policy).take(len(with_q0))
    assert [e.trajectory_id for e in again] == [e.trajectory_id for e in epoch]  # same snapshot + seed
    other = make_stream(lake, policy, seed=1).take(len(with_q0))
    assert [e.trajectory_id for e in other] != [e.trajectory_id for e in epoch]


def test_a_lake_stream_resumes_from_its_state(lake, policy):
    reference = make_stream(lake, policy)
    full = [e.trajectory_id for e in reference.take(25)]
    first = make_stream(lake, policy)
    head = [e.trajectory_id for e in first.take(11)]
    resumed = make_stream(lake, policy)
    resumed.load_state_dict(first.state_dict())
    assert head + [e.trajectory_id for e in resumed.take(14)] == full


def test_examples_carry_rewards_q0_cached_log_probs_and_mc_targets(lake, policy):
    stream = make_stream(lake, policy, where="prompt_id = 'countdown/3/1'", mc=True)
    (e,) = stream.take(1)
    assert e.reward == 0.0 and e.q0 == pytest.approx(q0_from_counts(10, 1, BETA))
    settings = StreamSettings(policy.model_id, BETA, 0, max_response_tokens=64, q0_prior=2.0)
    (smoothed,) = LakeStream(lake, "pinned", StreamConfig("lake", "lake", 1.0, where="prompt_id = 'countdown/3/1'"),
                             0, settings, policy).take(1)
    assert smoothed.q0 == pytest.approx(q0_from_counts(10, 1, BETA, prior=2.0)) != pytest.approx(e.q0)
    assert e.mc_positions == [1, 2] and e.mc_success == pytest.approx([0.3, 0.7])
    row = lake.sql(f"SELECT t.*, p.* FROM trajectories t JOIN prompts p USING (prompt_id) "
                   f"WHERE trajectory_id = '{e.trajectory_id}'").to_pylist()[0]
    prompt_ids, response_ids, tokenized = trajectory_token_ids(policy, tokenizer_id(policy), row)
    assert tokenized and (e.prompt_ids, e.response_ids) == (prompt_ids, response_ids)

    everything = make_stream(lake, policy)
    examples = everything.take(everything.size)
    backend, dtype = policy.precision
    cached = {r["trajectory_id"] for r in lake.sql(
        f"SELECT trajectory_id FROM logprobs WHERE backend = '{backend}' AND dtype = '{dtype}'", "pinned").to_pylist()}
    assert cached and everything.ref_recomputed == 1  # the bfloat16 row is scored live by the float32 trainer
    for e in examples:
        assert (e.ref_logprobs is not None) == (e.trajectory_id in cached)
        assert e.ref_logprobs is None or len(e.ref_logprobs) == len(e.response_ids)
        assert not math.isnan(e.q0) and e.mc_positions == []  # only mc streams carry MC targets


def test_duplicate_programs_can_be_left_out(lake, policy):
    (duplicate,) = lake.sql("SELECT trajectory_id FROM trajectories WHERE source = 'reference'", "pinned").to_pylist()
    assert [e.trajectory_id for e in make_stream(lake, policy, where="duplicate").take(2)] == \
        [duplicate["trajectory_id"]] * 2
    kept = {e.trajectory_id for e in make_stream(lake, policy, where="NOT duplicate").take(30)}
    assert duplicate["trajectory_id"] not in kept and len(kept) == make_stream(lake, policy).size - 1


def test_the_mixer_draws_fixed_shares_of_each_stream_and_repeats_for_the_same_seed(lake, policy):
    def mixer(seed: int) -> Mixer:
        settings = StreamSettings(policy.model_id, BETA, seed, max_response_tokens=64, page_size=3)
        early = StreamConfig("early", "lake", 0.75, where="prompt_id < 'countdown/3/2'")
        late = StreamConfig("late", "lake", 0.25, where="prompt_id >= 'countdown/3/2'")
        return Mixer([3, 1], {0: LakeStream(lake, "pinned", early, 0, settings, policy),
                              1: LakeStream(lake, "pinned", late, 1, settings, policy)})

    first, second, other = mixer(0), mixer(0), mixer(1)
    batches = [first.draw(step) for step in range(6)]
    for batch in batches:
        assert [e.stream for e in batch] == [0, 0, 0, 1]
        assert all((e.prompt_id < "countdown/3/2") == (e.stream == 0) for e in batch)
    ids = lambda batches: [[e.trajectory_id for e in b] for b in batches]  # noqa: E731
    assert ids(batches) == ids([second.draw(step) for step in range(6)])
    assert ids(batches) != ids([other.draw(step) for step in range(6)])


def test_stream_selection_errors_are_one_line(lake, policy):
    with pytest.raises(ValueError, match="stream 'lake': bad `where`"):
        make_stream(lake, policy, where="no_such_column > 1")
    with pytest.raises(ValueError, match="no trajectory matches"):
        make_stream(lake, policy, where="source = 'ppo'")


def test_online_prompts_need_q0_counts_for_spo_only(lake, policy):
    spo = online_prompts(lake, "pinned", "", policy.model_id, require_q0=True)
    assert [p for p, _, _ in spo] == [f"countdown/3/{i}" for i in range(5)]
    assert spo[0][1:] == (10, 0)  # the largest n wins
    ppo = online_prompts(lake, "pinned", "", policy.model_id, require_q0=False)
    assert len(ppo) == 6 and ppo[5][1] is None
    with pytest.raises(ValueError, match="no prompt matches"):
        online_prompts(lake, "pinned", "p.prompt_id = 'nope'", policy.model_id, require_q0=True)
