from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pytest

from spo_lake.lake import ContractError, contract, table_names
from spo_lake.lake.contracts import SCHEMA_DIR, to_json_text

TABLES = {"prompts", "trajectories", "evaluations", "values", "pivots", "logprobs", "runs"}


def test_every_design_table_has_a_versioned_contract_loaded_from_schemas():
    assert TABLES <= set(table_names())
    assert "snapshots" not in table_names()
    for name in [*table_names(), "snapshots"]:
        c = contract(name)
        raw = json.loads((SCHEMA_DIR / f"{name}.json").read_text())
        assert c.version == raw["version"] >= 1
        assert c.names == [col["name"] for col in raw["columns"]]
        assert {"created_at", "schema_version"} <= set(c.names)
        assert set(c.key) <= set(c.names)
    assert Path(SCHEMA_DIR).resolve() == (Path(__file__).parents[2] / "schemas").resolve()


def test_conform_fills_bookkeeping_columns_and_casts_to_the_contract():
    data = pa.table({"trajectory_id": ["a"], "prompt_id": ["p"], "source": ["human"], "response_text": ["r"],
                     "response_hash": ["h"], "token_ids": pa.array([[1, 2]], pa.list_(pa.int64()))})
    out = contract("trajectories").conform(data)
    assert out.schema == contract("trajectories").arrow_schema
    assert out.column("token_ids").type == pa.list_(pa.int32())
    assert out.column("schema_version").to_pylist() == [contract("trajectories").version]
    assert out.column("created_at").null_count == 0
    assert out.column("model_id").to_pylist() == [None]


@pytest.mark.parametrize("data, message", [
    (pa.table({"prompt_id": ["p"], "task": ["t"], "prompt": ["x"], "colour": ["red"]}), "unknown column"),
    (pa.table({"prompt_id": ["p"], "task": ["t"]}), "missing required column 'prompt'"),
    (pa.table({"prompt_id": ["p", None], "task": ["t", "t"], "prompt": ["x", "y"]}), "row 1: field 'prompt_id'"),
    (pa.table({"prompt_id": ["p"], "task": ["t"], "prompt": ["x"], "memory_limit_mb": [1.5]}), "memory_limit_mb"),
])
def test_conform_rejects_rows_that_break_the_contract(data, message):
    with pytest.raises(ContractError, match=message):
        contract("prompts").conform(data)


def test_json_text_refuses_nan():
    assert json.loads(to_json_text({"b": 1, "a": [1.5]})) == {"a": [1.5], "b": 1}
    with pytest.raises(ValueError):
        to_json_text({"x": math.nan})
