"""docs/interop.md's "read a snapshot without spo-lake" block, run as written: polars, daft, Ray Data and DuckDB read
the Delta tables at the versions `spolake snapshot show NAME --format json` gives, after the lake moved on and was
compacted."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spo_lake import Lake, ingest

PAGE = Path(__file__).resolve().parents[1] / "docs" / "interop.md"


def doc_block(marker: str) -> str:
    """The ```python block that follows `marker` in docs/interop.md."""
    text = PAGE.read_text()
    match = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", text, re.S)
    assert match, f"{PAGE.name} has no python block after {marker}"
    return match.group(1)


# starts Ray (Ray Data reads the snapshot)
@pytest.mark.integration
def test_the_documented_block_reads_a_snapshot_with_every_engine(tmp_path, monkeypatch):
    import ray  # daft and ray[data] are test extras: a missing one fails here rather than skipping

    lake = Lake.init(tmp_path / "lake")
    rows = [{"prompt_id": "p1", "prompt": "reach 3", "response": f"{i}+1", "reward": -(i % 2)} for i in range(5)]
    ingest(lake, rows[:3], task="countdown", source="reference")
    ingest(lake, rows[3:], task="countdown", source="human")
    lake.snapshot("exp-1")
    ingest(lake, [{"prompt_id": "p1", "response": "later"}], source="policy")  # after the snapshot
    lake.compact()
    expected = lake.sql("SELECT source, count(*) AS n FROM trajectories GROUP BY 1 ORDER BY 1", snapshot="exp-1")

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SPOLAKE_LAKE", str(tmp_path / "lake"))
    scope: dict = {}
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)  # the block's read_delta joins this one
    try:
        exec(doc_block("<!-- tested: tests/test_snapshot_readers.py -->"), scope)  # noqa: S102 (our docs)
        traj = scope["traj"]
        assert traj["version"] == lake.get_snapshot("exp-1").versions["trajectories"] < lake.version("trajectories")
        assert Path(traj["path"]) == tmp_path / "lake" / "trajectories"
        assert traj["rows"] == 5
        by_source = [(r["source"], r["n"]) for r in expected.to_pylist()]
        assert scope["df"].group_by("source").len().sort("source").rows() == by_source
        assert scope["ddf"].count_rows() == 5
        assert scope["ds"].count() == 5
        assert scope["counts"] == by_source
    finally:
        ray.shutdown()


def test_snapshot_show_json_names_every_table_with_its_path_and_version(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    lake.snapshot("empty")
    out = subprocess.run([str(Path(sys.executable).with_name("spolake")), "--lake", str(tmp_path / "lake"),
                          "snapshot", "show", "empty", "--format", "json"], capture_output=True, text=True, check=True)
    shown = json.loads(out.stdout)
    assert shown["name"] == "empty" and shown["lake"] == str(tmp_path / "lake")
    assert shown["tables"] == {t: {"path": str(tmp_path / "lake" / t), "version": v, "rows": 0}
                               for t, v in lake.get_snapshot("empty").versions.items()}
