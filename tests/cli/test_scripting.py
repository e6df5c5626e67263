"""The CLI for scripts: `--format json` results, the ingest flags and field list, the example input, object-store
options reaching deltalake."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from spo_lake.ingest.shapes import TRAJECTORY_FIELD_DOCS
from spo_lake.lake import Lake

SAMPLES = Path(__file__).resolve().parents[2] / "examples" / "samples.jsonl"
SPOLAKE = str(Path(sys.executable).with_name("spolake"))


def test_the_example_input_ingests_and_reingests_as_the_readme_says(spolake, lake_dir):
    assert spolake("prompts", "add", "--dataset", "countdown", "--n", "3", "--seed", "0").exit_code == 0
    first = spolake("ingest", SAMPLES, "--source", "reference", "--model", "my-model", "--format", "json")
    assert first.exit_code == 0, first.stderr
    lines = SAMPLES.read_text().splitlines()
    assert json.loads(first.stdout) == {"path": str(SAMPLES), "new": len(lines), "present": 0, "prompts_new": 0,
                                        "evaluations_new": 0}
    again = spolake("ingest", SAMPLES, "--source", "reference")  # no --model: still the same rows
    assert again.exit_code == 0 and f"0 new, {len(lines)} already present" in again.stderr
    assert Lake.open(lake_dir).sql("SELECT DISTINCT model_id FROM trajectories WHERE source = 'reference'").to_pylist() \
        == [{"model_id": "my-model"}]


def test_ingest_help_lists_every_field():
    out = subprocess.run([SPOLAKE, "ingest", "--help"], capture_output=True, text=True, env={"COLUMNS": "200"})
    assert out.returncode == 0
    for field in TRAJECTORY_FIELD_DOCS:
        assert f"{field}:" in out.stdout
    assert "response_text" in out.stdout and "examples/samples.jsonl" in out.stdout


def test_reward_map_extra_and_schema_names_through_the_cli(spolake, lake_dir, tmp_path):
    data = tmp_path / "tool.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "reach 3", "answer": "1+2", "reward": 1, "judge": "x"},
        {"prompt": "reach 3", "answer": "1-2", "reward": 0, "judge": "y"}]))
    base = ("ingest", data, "--task", "countdown", "--map", "response_text=answer")
    refused = spolake(*base)
    assert refused.exit_code == 1
    assert refused.stderr.strip().splitlines() == [
        f"error: {data}:line 1: field 'reward': value 1.0 is not 0 (pass) or -1 (fail); map another convention with "
        "--reward-map 1=0,0=-1 (or binary; >=0.5 for float scores)"]
    assert Lake.open(lake_dir).count("trajectories") == 0
    assert spolake(*base, "--extra", "error", "--reward-map", "binary").exit_code == 1
    done = spolake(*base, "--reward-map", "1=0,0=-1")
    assert done.exit_code == 0, done.stderr
    got = Lake.open(lake_dir).sql("""SELECT t.response_text, t.metadata, e.reward FROM trajectories t
                                     JOIN evaluations e USING (trajectory_id) ORDER BY 1""").to_pylist()
    assert [(g["response_text"], g["reward"], json.loads(g["metadata"])) for g in got] == [
        ("1+2", 0.0, {"judge": "x", "reward_input": 1.0, "reward_map": "1=0,0=-1"}),
        ("1-2", -1.0, {"judge": "y", "reward_input": 0.0, "reward_map": "1=0,0=-1"})]


def test_lake_verbs_print_json(spolake, lake_dir, tmp_path):
    assert spolake("prompts", "add", "--dataset", "countdown", "--n", "2", "--seed", "0").exit_code == 0
    created = spolake("snapshot", "create", "s1", "--note", "n", "--format", "json")
    assert json.loads(created.stdout)["versions"] == Lake.open(lake_dir).get_snapshot("s1").versions
    listed = json.loads(spolake("snapshot", "list", "--format", "json").stdout)
    assert [(s["name"], s["note"]) for s in listed] == [("s1", "n")]
    stats = json.loads(spolake("stats", "--format", "json").stdout)
    assert {r["table"]: r["rows"] for r in stats["tables"]}["prompts"] == 2
    assert [r["source"] for r in stats["sources"]] == ["human"] and stats["tasks"][0]["task"] == "countdown"
    history = json.loads(spolake("history", "prompts", "--format", "json").stdout)
    assert history[0]["operation"] in ("WRITE", "CREATE TABLE") and isinstance(history[0]["metrics"], dict)
    dedup = spolake("dedup", "--format", "json")
    assert dedup.exit_code == 0, dedup.stderr
    assert set(json.loads(dedup.stdout)) == {"hashed", "groups", "duplicates", "summary"}


def test_storage_options_reach_deltalake_from_the_flag_and_the_environment(tmp_path):
    """No server listens on port 9: the error names the endpoint only if the options reached deltalake."""
    options = ["AWS_ENDPOINT_URL=http://127.0.0.1:9", "AWS_ALLOW_HTTP=true", "AWS_ACCESS_KEY_ID=k",
               "AWS_SECRET_ACCESS_KEY=s", "AWS_REGION=us-east-1", "max_retries=0"]
    flags = [a for o in options for a in ("--storage-option", o)]
    by_flag = subprocess.run([SPOLAKE, "--lake", "s3://bucket/lake", *flags, "stats"], capture_output=True,
                             text=True, timeout=1200)
    env = {"PATH": "/usr/bin:/bin", "SPOLAKE_STORAGE_OPTIONS": " ".join(options)}
    by_env = subprocess.run([SPOLAKE, "--lake", "s3://bucket/lake", "stats"], capture_output=True, text=True,
                            timeout=1200, env=env)
    for result in (by_flag, by_env):
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "127.0.0.1:9" in lines[0] and "\x1b[" not in lines[0]
    bad = subprocess.run([SPOLAKE, "--storage-option", "novalue", "stats"], capture_output=True, text=True)
    assert (bad.returncode, bad.stderr) == (1, "error: --storage-option expects KEY=VALUE, got 'novalue'\n")


def test_a_dpo_export_loads_as_a_dataset_and_reingests_through_the_cli_as_a_noop(spolake, lake_dir, tmp_path):
    import datasets

    assert spolake("prompts", "add", "--dataset", "countdown", "--n", "2", "--seed", "0").exit_code == 0
    wrong = tmp_path / "wrong.jsonl"
    wrong.write_text("".join(json.dumps({"prompt_id": f"countdown/0/{i}", "response": "1+1", "passed": False}) + "\n"
                             for i in range(2)))
    assert spolake("ingest", wrong, "--model", "m").exit_code == 0
    assert spolake("snapshot", "create", "s").exit_code == 0
    out = tmp_path / "pairs"
    done = spolake("export", "--snapshot", "s", "--shape", "dpo", "--format", "hf", "--out", out)
    assert done.exit_code == 0 and "exported 2 rows (dpo)" in done.stderr
    pairs = datasets.load_from_disk(str(out))
    assert pairs.column_names[:3] == ["prompt", "chosen", "rejected"] and set(pairs["rejected"]) == {"1+1"}
    before = Lake.open(lake_dir).versions()
    again = spolake("ingest", out, "--hf")
    assert again.exit_code == 0 and "0 new, 4 already present" in again.stderr
    assert Lake.open(lake_dir).versions() == before
