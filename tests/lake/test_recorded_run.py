"""`recorded_run`: the `runs` rows of a run's life, on a real lake."""
from __future__ import annotations

import json
from contextlib import nullcontext

import pytest

from spo_lake.lake.rows import recorded_run


def statuses(lake, run_id: str) -> list[tuple[str, dict]]:
    rows = lake.sql("SELECT status, metrics FROM runs WHERE run_id = $id ORDER BY created_at", params={"id": run_id})
    return [(r["status"], json.loads(r["metrics"])) for r in rows.to_pylist()]


@pytest.mark.parametrize("raised, status", [(None, "finished"), (ValueError("bad row"), "failed"),
                                            (KeyboardInterrupt(), "interrupted")])
def test_a_run_ends_finished_failed_on_an_error_or_interrupted_on_ctrl_c(lake, raised, status):
    with pytest.raises(type(raised)) if raised else nullcontext():
        with recorded_run(lake, "sample", {"seed": 3}) as run:
            run.metrics["n"] = 2
            if raised:
                raise raised
    assert statuses(lake, run.run_id) == [("running", {}), (status, {"n": 2})]

