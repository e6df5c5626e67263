"""Ingest's field names are the schema's (`response_text`, ...); the short names and TRL's `completion` work too."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "samples.jsonl"


@pytest.fixture
def lake_with_prompts(spolake):
    assert spolake("prompts", "add", "--dataset", "countdown", "--n", "3", "--seed", "0").exit_code == 0
    return spolake


def write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_help_lists_the_schema_names_with_their_aliases(spolake):
    out = re.sub(r"\s+", " ", spolake("ingest", "--help").stdout)
    for field in ("response_text", "model_id", "tokenizer_id", "behavior_logprobs", "token_ids", "prompt_id"):
        assert f" {field}: " in out
    assert "also: response, and TRL's completion" in out and "examples/samples.jsonl" in out


def test_the_example_file_uses_the_documented_names_and_ingests_once(lake_with_prompts):
    assert all(set(json.loads(line)) == {"prompt_id", "response_text"} for line in EXAMPLE.read_text().splitlines())
    first = lake_with_prompts("ingest", str(EXAMPLE), "--source", "reference", "--model", "my-model")
    assert first.exit_code == 0 and ": 6 new, 0 already present" in first.stderr
    again = lake_with_prompts("ingest", str(EXAMPLE), "--source", "reference")
    assert again.exit_code == 0 and ": 0 new, 6 already present" in again.stderr


@pytest.mark.parametrize("rows, args", [
    ([{"prompt_id": "countdown/0/0", "response_text": "1+2"}], []),
    ([{"prompt_id": "countdown/0/0", "response": "1+2"}], []),
    ([{"prompt_id": "countdown/0/0", "completion": "1+2"}], []),
    ([{"prompt_id": "countdown/0/0", "completion": "1+2"}], ["--map", "response_text=completion"]),
    ([{"prompt_id": "countdown/0/0", "answer": "1+2"}], ["--map", "response_text=answer"]),
    ([{"prompt_id": "countdown/0/0", "answer": "1+2"}], ["--map", "response=answer"]),
])
def test_every_spelling_lands_the_same_trajectory(lake_with_prompts, tmp_path, rows, args):
    first = lake_with_prompts("ingest", write(tmp_path / "a.jsonl", rows), "--source", "policy", *args)
    assert first.exit_code == 0 and ": 1 new," in first.stderr, first.stderr
    canonical = write(tmp_path / "b.jsonl", [{"prompt_id": "countdown/0/0", "response_text": "1+2"}])
    again = lake_with_prompts("ingest", canonical, "--source", "policy")
    assert ": 0 new, 1 already present" in again.stderr


@pytest.mark.parametrize("row, message", [
    ({"prompt_id": "countdown/0/0"}, "missing required field 'response_text'"),
    ({"prompt_id": "countdown/0/0", "response": 5}, "field 'response_text': expected a string"),
    ({"prompt_id": "countdown/0/0", "response_text": "1", "model": 3}, "field 'model_id': expected a string"),
])
def test_errors_name_the_schema_field(lake_with_prompts, tmp_path, row, message):
    result = lake_with_prompts("ingest", write(tmp_path / "bad.jsonl", [row]))
    assert result.exit_code == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'bad.jsonl'}:line 1: {message}")
