"""Input shapes other tools produce (TRL's prompt/completion, conversational and preference data, datasets with
extra columns, other reward conventions) land in the lake through the real ingest path."""
from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pytest

from spo_lake import ingest
from spo_lake.ingest import IngestError, ingest_prompts
from spo_lake.lake import Lake

PROMPT = "Using the numbers 1, 2 (each at most once) and + - * / ( ), write an expression equal to 3.\nAnswer:"
PID = "prompt-" + hashlib.sha256(PROMPT.encode()).hexdigest()[:16]


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake.init(tmp_path / "lake")


def rows(lake: Lake) -> list[dict]:
    return lake.sql("""SELECT t.prompt_id, t.response_text, t.source, t.model_id, t.metadata, e.passed, e.reward
                       FROM trajectories t LEFT JOIN evaluations e USING (trajectory_id)
                       ORDER BY t.response_text""").to_pylist()


def meta(row: dict) -> dict:
    return json.loads(row["metadata"]) if row["metadata"] else {}


def test_prompt_completion_rows_without_prompt_id_get_a_stable_hashed_id(lake):
    data = [{"prompt": PROMPT, "completion": " 1+2"}, {"prompt": PROMPT, "completion": " 1*2"}]
    report = ingest(lake, data, task="countdown", model="m")
    assert (report.new, report.prompts_new) == (2, 1)
    assert lake.sql("SELECT prompt_id, task, prompt FROM prompts").to_pylist() == [
        {"prompt_id": PID, "task": "countdown", "prompt": PROMPT}]
    assert ingest(lake, data, task="countdown", model="m").summary() == "0 new, 2 already present"


def test_an_arrow_table_and_a_dataset_take_the_same_path_as_records(lake):
    import datasets

    table = pa.table({"prompt": [PROMPT], "completion": [" 1+2"], "score": [0.9]})
    assert ingest(lake, table, task="countdown").new == 1
    some_ids = pa.table({"prompt_id": [None, PID], "prompt": [PROMPT, None], "response": ["a", "b"]})
    assert ingest(lake, some_ids, task="countdown").new == 2  # a null prompt_id is derived from its prompt
    again = ingest(lake, datasets.Dataset(table), task="countdown")
    assert again.summary() == "0 new, 1 already present"
    assert meta(rows(lake)[0]) == {"score": 0.9}


def test_conversational_rows_become_text_and_keep_their_prompt_messages(lake):
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    data = [
        {"messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": " 1+2"}]},
        {"prompt": system, "completion": [{"role": "assistant", "content": " 2+1"}]},
    ]
    assert ingest(lake, data, task="countdown").new == 2
    got = rows(lake)
    assert [(r["prompt_id"], r["response_text"]) for r in got] == [(PID, " 1+2"), ("prompt-" + hashlib.sha256(
        f"Be brief.\n\n{PROMPT}".encode()).hexdigest()[:16], " 2+1")]
    assert meta(got[0]) == {} and meta(got[1]) == {"prompt_messages": system}
    bad = [{"messages": [{"role": "user", "content": PROMPT}, {"role": "user", "content": "again"}]}]
    with pytest.raises(IngestError, match=r"input:row 1: field 'messages': the last message must be the assistant"):
        ingest(lake, bad, task="countdown")
    with pytest.raises(IngestError, match=r"input:row 1: field 'prompt': message 0 is not \{role, content\}"):
        ingest(lake, [{"prompt": [{"role": "user", "content": [{"type": "image"}]}], "completion": "x"}])


def test_preference_rows_split_into_a_passing_and_a_failing_trajectory(lake):
    data = [{"prompt": PROMPT, "chosen": " 1+2", "rejected": " 1-2", "score_chosen": 9}]
    report = ingest(lake, data, task="countdown", source="reference")
    assert (report.new, report.evaluations_new) == (2, 2)
    got = rows(lake)
    assert [(r["response_text"], r["passed"], r["reward"]) for r in got] == [(" 1+2", True, 0.0), (" 1-2", False, -1.0)]
    pair = meta(got[0])["pair"]
    assert [meta(r) for r in got] == [{"score_chosen": 9, "preference": "chosen", "pair": pair},
                                      {"score_chosen": 9, "preference": "rejected", "pair": pair}]
    implicit = [{"chosen": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": " 2+1"}],
                 "rejected": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": " 2-1"}]}]
    assert ingest(lake, implicit, task="countdown").new == 2
    assert {r["prompt_id"] for r in rows(lake)} == {PID}
    with pytest.raises(IngestError, match=r"input:row 1: missing required field 'rejected'"):
        ingest(lake, [{"prompt": PROMPT, "chosen": "x"}], task="countdown")


def test_extra_fields_go_to_metadata_or_are_dropped_or_refused(lake):
    data = [{"prompt": PROMPT, "completion": " 1+2", "judge": "gpt", "metadata": {"seed": 1}}]
    with pytest.raises(IngestError, match=r"input:row 1: unknown field\(s\) \['judge'\]"):
        ingest(lake, data, task="countdown", extra="error")
    ingest(lake, data, task="countdown", extra="drop")
    assert meta(rows(lake)[0]) == {"seed": 1}
    ingest(lake, data, task="countdown", model="m2")
    assert sorted(json.dumps(meta(r), sort_keys=True) for r in rows(lake)) == [
        '{"judge": "gpt", "seed": 1}', '{"seed": 1}']
    with pytest.raises(IngestError, match=r"input:row 1: field 'seed': also a key of 'metadata'"):
        ingest(lake, [{**data[0], "seed": 2}], task="countdown")


def test_rewards_outside_the_lake_contract_need_an_explicit_map(lake):
    data = [{"prompt": PROMPT, "completion": " 1+2", "reward": 1},
            {"prompt": PROMPT, "completion": " 1*2", "reward": 0}]
    with pytest.raises(IngestError, match=r"^input:row 1: field 'reward': value 1.0 is not 0 \(pass\) or -1 \(fail\); "
                                          r"map another convention with --reward-map 1=0,0=-1"):
        ingest(lake, data, task="countdown")
    assert lake.count("trajectories") == 0
    report = ingest(lake, data, task="countdown", reward_map="binary")
    assert (report.new, report.evaluations_new) == (2, 2)
    got = rows(lake)
    assert [(r["response_text"], r["passed"], r["reward"]) for r in got] == [(" 1*2", False, -1.0), (" 1+2", True, 0.0)]
    assert [meta(r) for r in got] == [{"reward_input": 0.0, "reward_map": "1=0,0=-1"},
                                      {"reward_input": 1.0, "reward_map": "1=0,0=-1"}]
    with pytest.raises(IngestError, match=r"input:row 1: field 'reward': value 0.5 is not in the reward map 1=0,0=-1"):
        ingest(lake, [{**data[0], "reward": 0.5}], task="countdown", reward_map="1=0,0=-1")
    with pytest.raises(ValueError, match=r"maps 1 to 1; lake rewards are 0 \(pass\) or -1"):
        ingest(lake, data, task="countdown", reward_map="1=1")


def test_passed_gives_the_reward_and_never_disagrees_with_it(lake):
    ingest(lake, [{"prompt": PROMPT, "completion": " 1+2", "passed": True},
                  {"prompt": PROMPT, "completion": " 1-2", "passed": False, "reward": -1}], task="countdown")
    assert [(r["passed"], r["reward"]) for r in rows(lake)] == [(True, 0.0), (False, -1.0)]
    with pytest.raises(IngestError, match=r"input:row 1: field 'passed': true disagrees with reward -1"):
        ingest(lake, [{"prompt": PROMPT, "completion": "x", "passed": True, "reward": -1}], task="countdown")
    with pytest.raises(IngestError, match=r"input:row 1: field 'passed': expected true or false, got str 'yes'"):
        ingest(lake, [{"prompt": PROMPT, "completion": "x", "passed": "yes"}], task="countdown")


def test_schema_names_are_accepted_for_input_names(lake):
    ingest(lake, [{"prompt": PROMPT, "response_text": " 1+2", "model_id": "m", "tokenizer_id": "tok",
                   "token_ids": [1], "behavior_logprobs": [-0.5], "response_hash": "ignored", "created_at": "x"}],
           task="countdown")
    got = lake.sql("SELECT response_text, model_id, tokenizer_id, behavior_logprobs, metadata FROM trajectories")
    assert got.to_pylist() == [{"response_text": " 1+2", "model_id": "m", "tokenizer_id": "tok",
                                "behavior_logprobs": [-0.5], "metadata": None}]
    with pytest.raises(IngestError, match=r"input:row 1: field 'response_text': given together with 'response'"):
        ingest(lake, [{"prompt": PROMPT, "response": "a", "response_text": "b"}], task="countdown")
    assert ingest(lake, [{"prompt": PROMPT, "answer": " 1+2"}], task="countdown",
                  mapping={"response_text": "answer"}, model="m", tokenizer="tok").new == 0


def test_reingest_without_model_finds_the_rows_an_ingest_with_model_added(lake):
    data = [{"prompt": PROMPT, "completion": " 1+2"}, {"prompt": PROMPT, "completion": " 1+2"},
            {"prompt": PROMPT, "completion": " 2+1"}]
    assert ingest(lake, data, task="countdown", model="my-model").new == 3
    assert ingest(lake, data, task="countdown").summary() == "0 new, 3 already present"
    assert ingest(lake, data, task="countdown", source="policy").new == 3  # another source is another trajectory
    assert ingest(lake, data + data[:1], task="countdown").summary() == "1 new, 3 already present"


def test_prompt_rows_take_the_same_shapes(lake):
    report = ingest_prompts(lake, [{"task": "countdown", "prompt": PROMPT, "level": "easy"}])
    assert report.new == 1
    assert lake.sql("SELECT prompt_id, metadata FROM prompts").to_pylist() == [
        {"prompt_id": PID, "metadata": '{"level": "easy"}'}]


def test_token_columns_stay_columnar_when_other_fields_are_reshaped(lake):
    table = pa.table({"prompt": [PROMPT, PROMPT], "completion": [" 1+2", " 2+1"], "judge": ["a", "b"],
                      "token_ids": pa.array([[5, 6], [7]], pa.list_(pa.int32())),
                      "behavior_logprobs": pa.array([[-0.5, -0.25], [-1.0]], pa.list_(pa.float32()))})
    assert ingest(lake, table, task="countdown").new == 2
    got = lake.sql("SELECT response_text, token_ids, behavior_logprobs, metadata FROM trajectories ORDER BY 1")
    assert got.to_pylist() == [
        {"response_text": " 1+2", "token_ids": [5, 6], "behavior_logprobs": [-0.5, -0.25], "metadata": '{"judge": "a"}'},
        {"response_text": " 2+1", "token_ids": [7], "behavior_logprobs": [-1.0], "metadata": '{"judge": "b"}'}]
    bad = table.set_column(3, "token_ids", pa.array([[5, 6], [-7]], pa.list_(pa.int32())))
    with pytest.raises(IngestError, match=r"^input:row 2: field 'token_ids': element 0 -7 is not in \[0, "):
        ingest(lake, bad, task="countdown", model="other")
    pairs = pa.table({"prompt": [PROMPT], "chosen": [" 1+2"], "rejected": [" 1-2"],
                      "token_ids": pa.array([[1]], pa.list_(pa.int64()))})  # whose token ids would they be?
    with pytest.raises(IngestError, match=r"^input:row 1: field 'token_ids': not allowed in a preference row"):
        ingest(lake, pairs, task="countdown")


def test_a_conversational_dataset_column_of_structs(lake):
    import datasets

    data = datasets.Dataset.from_list([
        {"messages": [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": " 1+2"}], "id": 1}])
    assert ingest(lake, data, task="countdown").new == 1
    assert [(r["prompt_id"], r["response_text"], meta(r)) for r in rows(lake)] == [(PID, " 1+2", {"id": 1})]
