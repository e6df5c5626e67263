"""Output reads well outside a terminal: piped to a file, a table prints every cell in full as Markdown (a drawn table
is cut to 80 columns there: `0.0…`, `pas…`), and no progress bar writes `\\r` frames into the log."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SPOLAKE = str(Path(sys.executable).with_name("spolake"))
# importing the CLI in this process (the in-process fixtures) may have set TQDM_DISABLE here: the subprocesses must
# set it themselves
ENV = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
LONG = "passed " * 30  # 210 characters: a drawn table cuts it at 117, an 80-column one far sooner
QUERY = (f"SELECT 0.123456789012345 AS mean_pass_at_1_over_every_held_out_prompt, '{LONG.strip()}' AS verdict, "
         "'a|b' AS piped")


def piped(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A real `spolake` process whose stdout and stderr are pipes, not terminals."""
    return subprocess.run([SPOLAKE, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def test_a_piped_table_is_markdown_with_every_cell_in_full(tmp_path):
    assert piped("--lake", "lake", "init", cwd=tmp_path).returncode == 0
    done = piped("--lake", "lake", "sql", QUERY, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "| mean_pass_at_1_over_every_held_out_prompt | verdict | piped |"
    assert lines[1] == "| --- | --- | --- |"
    assert lines[2] == f"| 0.123456789012345 | {LONG.strip()} | a\\|b |"  # a | in a cell does not split it
    assert "…" not in done.stdout and "\r" not in done.stdout + done.stderr


def test_the_demo_summary_table_prints_its_numbers_in_full_to_a_pipe(tmp_path):
    """The summary `spolake demo` prints (spo_lake.demo.report.print_table), as it reaches a log file."""
    code = ("from spo_lake.demo.report import COLUMNS, print_table\n"
            "print_table([['SPO half-online'] + ['0.123 ± 0.045'] * (len(COLUMNS) - 1)], 'countdown, 1 seed(s)')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "**countdown, 1 seed(s)**"
    row = done.stdout.rstrip().splitlines()[-1]
    assert row.startswith("| SPO half-online | 0.123 ± 0.045 |") and row.count("0.123 ± 0.045") > 1
    assert "…" not in done.stdout


def test_progress_bars_write_no_frames_to_a_log(filled, tmp_path):
    """rich's bars (dedup's) print their last state once; a library's tqdm bar (transformers de-quantizing a GGUF
    file in `spolake model import`) prints nothing, where it used to write one `\\r` frame per update."""
    lake = tmp_path / "lake"  # the `filled` fixture's lake
    done = piped("--lake", str(lake), "dedup", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr + done.stdout
    code = ("import spo_lake.cli.app\n"  # what the spolake entry point imports first
            "from tqdm.auto import tqdm\n"
            "for _ in tqdm(range(200), desc='Converting and de-quantizing GGUF tensors...'): pass\n")
    foreign = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=600)
    assert foreign.returncode == 0, foreign.stderr
    assert "\r" not in foreign.stderr and "de-quantizing" not in foreign.stderr
