"""Verbs that run no model start without torch and transformers: importing them costs seconds in every process (on a
four-prompt lake `spolake evaluate` took 6.1 s while the rollout engine imported the model backend, 2.2 s since)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

MODEL_LIBRARIES = ("torch", "transformers")


def loaded(lake, *args: str) -> list[str]:
    """The model libraries a real `spolake --lake LAKE ARGS` process imported (python -X importtime's report)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "spo_lake.cli.app", "--lake", str(lake), *args],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    return [name for name in MODEL_LIBRARIES if name in imported]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("startup")
    (root / "t.jsonl").write_text(json.dumps({"prompt_id": "p1", "response": "1 + 2"}) + "\n")
    (root / "p.jsonl").write_text(json.dumps({"prompt_id": "p1", "task": "countdown",
                                              "prompt": "Using the numbers [1, 2], make 3."}) + "\n")
    for args in (["init"], ["prompts", "add", str(root / "p.jsonl")], ["ingest", str(root / "t.jsonl")]):
        assert loaded(root / "lake", *args) == []
    return root / "lake"


@pytest.mark.parametrize("args", [["judge"], ["dedup"], ["report", "passk", "--k", "1"], ["sql", "SELECT 1"],
                                  ["snapshot", "create", "s"]])
def test_a_verb_without_a_model_does_not_import_torch_or_transformers(lake, args):
    assert loaded(lake, *args) == []
