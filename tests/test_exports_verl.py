"""`export --shape verl-rl / verl-sft`: Parquet with the columns verl's RLHFDataset and SFT datasets read (the shapes
its examples/data_preprocess scripts write), loadable by `datasets` as verl loads them."""
from __future__ import annotations

import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from spo_lake import Lake, ingest
from spo_lake.cli.app import app
from spo_lake.ingest.datasets import ingest_dataset


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Lake:
    lake = Lake.init(tmp_path_factory.mktemp("verl") / "lake")
    ingest_dataset(lake, "countdown", None, n=3, seed=0)  # solver solutions: passing
    ingest(lake, [{"prompt_id": "countdown/0/0", "response": " 1+1", "reward": -1}], source="reference", model="m")
    lake.snapshot("verl")
    return lake


def run_export(lake: Lake, shape: str, out) -> None:
    res = CliRunner().invoke(app, ["--lake", str(lake.root), "export", "--snapshot", "verl", "--shape", shape,
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output


def test_verl_rl_parquet_has_verls_columns(lake, tmp_path):
    run_export(lake, "verl-rl", tmp_path / "train.parquet")
    table = pq.read_table(tmp_path / "train.parquet")
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert table.schema.field("prompt").type == pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    assert {f.name for f in table.schema.field("reward_model").type} == {"style", "ground_truth"}
    rows = datasets.load_dataset("parquet", data_files=str(tmp_path / "train.parquet"), split="train")  # as verl does
    assert len(rows) == 3 and rows[0]["data_source"] == "spo_lake/countdown" and rows[0]["ability"] == "countdown"
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["reward_model"]["style"] == "rule"
    prompts = {r["prompt_id"]: r for r in lake.sql("SELECT prompt_id, tests FROM prompts").to_pylist()}
    first = prompts[rows[0]["extra_info"]["prompt_id"]]
    assert json.loads(rows[0]["reward_model"]["ground_truth"]) == json.loads(first["tests"])


def test_verl_sft_parquet_has_messages_and_prompt_response(lake, tmp_path):
    run_export(lake, "verl-sft", tmp_path / "sft.parquet")
    rows = pq.read_table(tmp_path / "sft.parquet").to_pylist()
    passing = lake.sql("SELECT count(*) AS n FROM evaluations WHERE passed").column("n")[0].as_py()
    assert len(rows) == passing > 0 and " 1+1" not in {r["response"] for r in rows}  # the failing answer is not SFT
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant"]
    assert rows[0]["messages"][0]["content"] == rows[0]["prompt"]
    assert rows[0]["messages"][1]["content"] == rows[0]["response"]
