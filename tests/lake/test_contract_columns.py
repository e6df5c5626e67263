"""Columns a newer contract adds are nullable and read as NULL on data written before them."""
from __future__ import annotations

import pyarrow as pa
from deltalake import write_deltalake

from spo_lake.lake import Lake, contract


def test_a_table_written_before_a_new_column_reads_it_as_null(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    full = contract("logprobs").arrow_schema
    old = pa.schema([f for f in full if f.name not in ("backend", "dtype")])  # the version-1 contract
    row = {"trajectory_id": "t1", "model_id": "m", "tokenizer_id": "tok", "token_ids": [1, 2], "logprobs": [-0.5, -1.0],
           "created_at": pa.scalar(0, pa.timestamp("us", "UTC")).as_py(), "schema_version": 1}
    write_deltalake(lake.delta("logprobs").table_uri, pa.Table.from_pylist([row], old), mode="overwrite",
                    schema_mode="overwrite")
    lake = Lake.open(tmp_path / "lake")
    got = lake.sql("SELECT trajectory_id, backend, dtype FROM logprobs").to_pylist()
    assert got == [{"trajectory_id": "t1", "backend": None, "dtype": None}]
    lake.append("logprobs", [{**{k: v for k, v in row.items() if k not in ("created_at", "schema_version")},
                              "trajectory_id": "t2", "backend": "transformers", "dtype": "float32"}])
    got = lake.sql("SELECT trajectory_id, backend FROM logprobs ORDER BY 1").to_pylist()
    assert got == [{"trajectory_id": "t1", "backend": None}, {"trajectory_id": "t2", "backend": "transformers"}]
