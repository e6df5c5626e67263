"""Judging candidate code prints nothing of the candidate's own: no SyntaxWarning reaches the terminal."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SPOLAKE = str(Path(sys.executable).with_name("spolake"))


@pytest.mark.integration  # four spolake processes and HumanEval in the sandbox
def test_evaluate_shows_no_syntax_warnings_of_candidates(tmp_path):
    def spolake(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([SPOLAKE, "--lake", str(tmp_path / "lake"), *args], capture_output=True, text=True,
                              timeout=1200)
        assert done.returncode == 0, done.stderr
        return done

    spolake("prompts", "add", "--dataset", "humaneval", "--limit", "1")
    (pid,) = [r["prompt_id"] for r in json.loads(spolake("sql", "SELECT prompt_id FROM prompts", "--format", "json").stdout)]
    code = "def has_close_elements(numbers, threshold):\n    x = 2(3)\n    return '\\d' == x\n"  # two warnings
    (tmp_path / "w.jsonl").write_text(json.dumps({"prompt_id": pid, "response_text": code}) + "\n")
    spolake("ingest", str(tmp_path / "w.jsonl"))
    judged = spolake("evaluate", "--workers", "1")
    assert "Warning" not in judged.stderr, judged.stderr
    assert "passed 1 (50.0%)" in judged.stderr  # the human solution passes, the candidate fails
