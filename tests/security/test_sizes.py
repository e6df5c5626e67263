"""Hostile sizes are refused early, before they take memory: a Parquet cell or CSV field over the field limit, a
Parquet file with too many columns. The limits are set low here (env), so small files prove the refusal; the peak
memory of the full-size attacks is measured by tests/security/rss_probe.py (docs/security.md)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.security.conftest import one_line_error

LIMIT = 10_000


@pytest.fixture
def low_limits(monkeypatch):
    monkeypatch.setenv("SPOLAKE_MAX_LINE_BYTES", str(LIMIT))
    monkeypatch.setenv("SPOLAKE_MAX_COLUMNS", "50")


def test_a_parquet_cell_over_the_limit_is_refused_from_the_footer(filled, world, low_limits):
    path = world.tmp / "big.parquet"
    pq.write_table(pa.table({"prompt_id": ["p1"], "response": ["x" * (3 * LIMIT)]}), path)
    before = world.snapshot()
    one_line_error(filled("ingest", path), "row group 0", "field 'response'", "SPOLAKE_MAX_LINE_BYTES")
    world.contained(before)


def test_a_large_cell_hidden_among_small_rows_is_refused_naming_its_row(filled, world, low_limits):
    path = world.tmp / "hidden.parquet"
    responses = ["ok"] * 999 + ["y" * (3 * LIMIT)]
    pq.write_table(pa.table({"prompt_id": ["p1"] * 1000, "response": responses}), path)
    before = world.snapshot()
    one_line_error(filled("ingest", path), "row 1000", "field 'response'")
    world.contained(before)


def test_a_csv_field_over_the_limit_is_refused(filled, world, low_limits):
    path = world.tmp / "big.csv"
    path.write_text('prompt_id,response\np1,"' + "z" * (3 * LIMIT) + '"\n')
    before = world.snapshot()
    one_line_error(filled("ingest", path), "big.csv:line 2", "SPOLAKE_MAX_LINE_BYTES")
    world.contained(before)


def test_a_csv_multiline_field_over_the_limit_is_refused(filled, world, low_limits):
    path = world.tmp / "lines.csv"
    path.write_text('prompt_id,response\np1,"' + "short line\n" * (LIMIT // 5) + '"\n')
    before = world.snapshot()
    one_line_error(filled("ingest", path), "lines.csv", "field larger than field limit")
    world.contained(before)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_too_many_columns_are_refused(filled, world, low_limits, fmt):
    columns = {"prompt_id": ["p1"], "response": ["r"], **{f"c{i}": ["v"] for i in range(100)}}
    path = world.tmp / f"wide.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table(columns), path)
    else:
        path.write_text(",".join(columns) + "\n" + ",".join(v[0] for v in columns.values()) + "\n")
    before = world.snapshot()
    one_line_error(filled("ingest", path), "102 columns", "SPOLAKE_MAX_COLUMNS")
    world.contained(before)


def test_the_rss_probe_runs_small(tmp_path):
    """The measuring script's tiny dry run (the full sizes are for docs/security.md's table)."""
    probe = Path(__file__).with_name("rss_probe.py")
    out = subprocess.run([sys.executable, str(probe), "--scale", "0.001", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 5 and "accepted" in rows[2] and all("refused" in r for r in rows[3:]), out.stdout
