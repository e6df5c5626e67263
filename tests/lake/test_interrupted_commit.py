"""A Ctrl-C can land between a commit and the lease's note of it: the committed file must survive the clean-up."""
from __future__ import annotations

import pytest

from spo_lake.lake import Lake


def test_a_commit_interrupted_before_its_bookkeeping_keeps_its_file(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    with pytest.raises(KeyboardInterrupt):
        with lake.writing() as lease:
            landed = lake.stage("runs", [[{"run_id": "r1", "kind": "eval", "status": "running"}]], lease)
            dt = lake.delta("runs")  # the commit itself, as Lake.commit makes it, then the interrupt
            dt.create_write_transaction(landed.actions, mode="append", schema=dt.schema())
            lake.stage("runs", [[{"run_id": "r2", "kind": "eval", "status": "running"}]], lease)  # never committed
            raise KeyboardInterrupt
    assert Lake.open(tmp_path / "lake").sql("SELECT run_id FROM runs").to_pylist() == [{"run_id": "r1"}]
    parquet = [p for p in (tmp_path / "lake" / "runs").glob("*.parquet")]
    assert len(parquet) == 1  # the uncommitted staging is gone, the committed one stays
