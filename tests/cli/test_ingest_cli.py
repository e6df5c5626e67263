"""`spolake ingest` and `spolake prompts add` through the CLI: every input format, and the bad-input battery."""
from __future__ import annotations

import codecs
import csv
import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spo_lake.lake import Lake

PROMPT = {"prompt_id": "p1", "task": "countdown", "prompt": "reach 10"}
GOOD = [{"prompt_id": "p1", "response": "x = 1\n", "token_ids": [3, 4], "logprobs": [-0.5, -1.5], "reward": 0.0},
        {"prompt_id": "p1", "response": "x = 2\n", "reward": -1.0, "metadata": {"attempt": 2}}]


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.fixture
def ready(spolake, tmp_path):
    """A lake holding prompt p1."""
    (tmp_path / "prompts.jsonl").write_text(jsonl([PROMPT]))
    assert spolake("prompts", "add", tmp_path / "prompts.jsonl").exit_code == 0
    return spolake


def lake_state(lake_dir: Path) -> dict[str, int]:
    lake = Lake.open(lake_dir)
    return {**lake.versions(), "snapshots": lake.version("snapshots")}


def stored(lake_dir: Path) -> list[dict]:
    return Lake.open(lake_dir).sql("""SELECT t.response_text, t.token_ids, t.behavior_logprobs, t.metadata, t.source,
                                             e.reward FROM trajectories t LEFT JOIN evaluations e USING (trajectory_id)
                                      ORDER BY 1""").to_pylist()


# ---- formats ------------------------------------------------------------------------------------------------
def write_jsonl_gz(path: Path, rows: list[dict]) -> None:
    path.write_bytes(gzip.compress(jsonl(rows).encode()))


def write_parquet(path: Path, rows: list[dict]) -> None:
    rows = [{**r, "metadata": json.dumps(r["metadata"]) if "metadata" in r else None} for r in rows]
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_csv(path: Path, rows: list[dict]) -> None:
    cols = ["prompt_id", "response", "token_ids", "logprobs", "reward", "metadata"]
    cell = lambda v: "" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else str(v)  # noqa: E731
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(cols)
        writer.writerows([cell(r.get(c)) for c in cols] for r in rows)


def write_hf(path: Path, rows: list[dict]) -> None:
    import datasets

    rows = [{**r, "metadata": json.dumps(r["metadata"]) if "metadata" in r else None} for r in rows]
    datasets.Dataset.from_list(rows).save_to_disk(str(path))


def with_bom(writer):
    """The file `writer` makes, starting with a UTF-8 byte order mark (as Excel's "CSV UTF-8" and Windows editors
    write it)."""
    def write(path: Path, rows: list[dict]) -> None:
        writer(path, rows)
        path.write_bytes(codecs.BOM_UTF8 + path.read_bytes())
    return write


@pytest.mark.parametrize("name, writer, extra", [
    ("in.jsonl", lambda p, r: p.write_text(jsonl(r)), []),
    ("in.jsonl.gz", write_jsonl_gz, []),
    ("in.parquet", write_parquet, []),
    ("in.csv", write_csv, []),
    ("in_hf", write_hf, ["--hf"]),
    ("bom.jsonl", with_bom(lambda p, r: p.write_bytes(jsonl(r).replace("\n", "\r\n").encode())), []),
    ("bom.csv", with_bom(write_csv), []),
])
def test_every_format_ingests_the_same_rows_and_reingest_is_a_noop(ready, lake_dir, tmp_path, name, writer, extra):
    path = tmp_path / name
    writer(path, GOOD)
    result = ready("ingest", path, "--source", "reference", *extra)
    assert result.exit_code == 0, result.stderr
    assert "2 new, 0 already present" in result.stderr
    rows = stored(lake_dir)
    assert [(r["response_text"], r["token_ids"], r["source"], r["reward"]) for r in rows] == [
        ("x = 1\n", [3, 4], "reference", 0.0), ("x = 2\n", None, "reference", -1.0)]
    assert rows[0]["behavior_logprobs"] == [-0.5, -1.5]
    assert json.loads(rows[1]["metadata"]) == {"attempt": 2}
    before = lake_state(lake_dir)
    again = ready("ingest", path, "--source", "reference", *extra)
    assert again.exit_code == 0 and "0 new, 2 already present" in again.stderr
    assert lake_state(lake_dir) == before


def test_map_renames_input_columns(ready, lake_dir, tmp_path):
    path = tmp_path / "renamed.jsonl"
    path.write_text(jsonl([{"problem": "p1", "completion": "y = 3"}]))
    assert ready("ingest", path).exit_code == 1  # unknown fields without the mapping
    result = ready("ingest", path, "--map", "prompt_id=problem", "--map", "response=completion", "--model", "m7")
    assert result.exit_code == 0, result.stderr
    assert Lake.open(lake_dir).sql("SELECT prompt_id, response_text, model_id, source FROM trajectories").to_pylist() == [
        {"prompt_id": "p1", "response_text": "y = 3", "model_id": "m7", "source": "import"}]


def test_prompts_add_is_idempotent_and_refuses_conflicting_content(ready, lake_dir, tmp_path):
    path = tmp_path / "prompts.jsonl"
    result = ready("prompts", "add", path)
    assert result.exit_code == 0 and "0 new, 1 already present" in result.stderr
    changed = tmp_path / "changed.jsonl"
    changed.write_text(jsonl([{**PROMPT, "prompt": "reach 11"}]))
    before = lake_state(lake_dir)
    result = ready("prompts", "add", changed)
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        f"error: {changed}:line 1: field 'prompt': prompt 'p1' is already in the lake with different content "
        "(prompts are immutable; use a new prompt_id)"]
    assert lake_state(lake_dir) == before
    for field in ("prompt_id", "task"):  # a prompt no one can name landed before
        blank = tmp_path / f"blank-{field}.jsonl"
        blank.write_text(jsonl([{**PROMPT, "prompt_id": "p2", field: ""}]))
        result = ready("prompts", "add", blank)
        assert result.exit_code == 1 and result.stderr == f"error: {blank}:line 1: field '{field}': empty\n"
    assert lake_state(lake_dir) == before


def test_prompts_add_reads_a_directory_of_parquet_parts(ready, lake_dir, tmp_path):
    """As Spark and datasets write them (`x.parquet/part-*.parquet`): pyarrow reads the parts as one table."""
    parts = tmp_path / "more.parquet"
    parts.mkdir()
    for i in (2, 3):
        pq.write_table(pa.table({**{k: [v] for k, v in PROMPT.items()}, "prompt_id": [f"p{i}"]}),
                       parts / f"part-{i}.parquet")
    result = ready("prompts", "add", parts)
    assert result.exit_code == 0 and "2 new, 0 already present" in result.stderr, result.stderr
    assert Lake.open(lake_dir).count("prompts") == 3


# ---- the bad-input battery ---------------------------------------------------------------------------------
def row(**fields) -> dict:
    return {"prompt_id": "p1", "response": "ok", **fields}


def text(s: str):
    return lambda p: p.write_text(s)


BAD = [  # (id, file name, writer, location, field)
    ("truncated-json", "t.jsonl", text(jsonl([row()]) + '{"prompt_id": "p1", "response": '), "line 2", "response"),
    ("wrong-type", "t.jsonl", text(jsonl([row(response=5)])), "line 1", "response_text"),
    ("missing-required", "t.jsonl", text(jsonl([row(), {"response": "x"}])), "line 2", "prompt_id"),
    ("nan-reward", "t.jsonl", text('{"prompt_id": "p1", "response": "a", "reward": NaN}\n'), "line 1", "reward"),
    ("inf-logprob", "t.jsonl", text('{"prompt_id": "p1", "response": "a", "token_ids": [1], "logprobs": [-Infinity]}\n'),
     "line 1", "behavior_logprobs"),
    ("positive-logprob", "t.jsonl", text(jsonl([row(token_ids=[1], logprobs=[0.5])])), "line 1", "behavior_logprobs"),
    ("negative-token-id", "t.jsonl", text(jsonl([row(), row(token_ids=[1, -3])])), "line 2", "token_ids"),
    ("non-integer-token-id", "t.jsonl", text(jsonl([row(token_ids=[1, 2.5])])), "line 1", "token_ids"),
    ("huge-token-id", "t.jsonl", text(jsonl([row(token_ids=[2**40])])), "line 1", "token_ids"),
    ("length-mismatch", "t.jsonl", text(jsonl([row(token_ids=[1, 2], logprobs=[-1.0])])), "line 1", "behavior_logprobs"),
    ("invalid-utf8", "t.jsonl", lambda p: p.write_bytes(b'{"prompt_id": "p1", "response": "\xff\xfe"}\n'),
     "line 1", "response"),
    ("unknown-source", "t.jsonl", text(jsonl([row(source="martian")])), "line 1", "source"),
    ("empty-prompt-id", "t.jsonl", text(jsonl([row(), row(prompt_id=" ")])), "line 2", "prompt_id"),
    ("metadata-not-object", "t.jsonl", text(jsonl([row(metadata=[1, 2])])), "line 1", "metadata"),
    ("duplicate-key", "t.jsonl", text('{"prompt_id": "p1", "response": "a", "response": "b"}\n'), "line 1", "response"),
    ("negative-temperature", "t.jsonl", text(jsonl([row(temperature=-0.5)])), "line 1", "temperature"),
    ("gigantic-line", "t.jsonl", text(jsonl([row(), row(response="x" * 5000)])), "line 2", None),
    ("empty-file", "t.jsonl", text(""), None, None),
    ("blank-lines-only", "t.jsonl", text("\n\n"), None, None),
    ("corrupt-gzip", "t.jsonl.gz", lambda p: p.write_bytes(gzip.compress(jsonl([row()]).encode())[:-12]), None, None),
    ("parquet-wrong-column-type", "t.parquet",
     lambda p: pq.write_table(pa.table({"prompt_id": ["p1", "p1"], "response": ["a", "b"], "reward": [None, "high"]}), p),
     "row 2", "reward"),
    ("parquet-float-token-ids", "t.parquet",
     lambda p: pq.write_table(pa.table({"prompt_id": ["p1"], "response": ["a"], "token_ids": [[1.0, 2.0]]}), p),
     "row 1", "token_ids"),
    ("parquet-nan-reward", "t.parquet",
     lambda p: pq.write_table(pa.table({"prompt_id": ["p1", "p1"], "response": ["a", "b"], "reward": [0.0, float("nan")]}), p),
     "row 2", "reward"),
    ("parquet-invalid-utf8", "t.parquet",
     lambda p: pq.write_table(pa.table({"prompt_id": ["p1"], "response": pa.array([b"ok\xff"], pa.binary())})
                              .cast(pa.schema([("prompt_id", pa.string()), ("response", pa.string())]), safe=False), p),
     "row 1", "response_text"),
    ("parquet-not-parquet", "t.parquet", text("this is not parquet"), None, None),
    ("parquet-duplicate-column", "t.parquet",  # "a bug in spo-lake" (a KeyError) before
     lambda p: pq.write_table(pa.Table.from_arrays([pa.array(["p1"]), pa.array(["a"]), pa.array(["b"])],
                                                   names=["prompt_id", "response", "response"]), p), None, "response"),
    ("csv-not-a-number", "t.csv", text("prompt_id,response,reward\np1,a,0\np1,b,high\n"), "line 3", "reward"),
    ("csv-bad-token-ids", "t.csv", text('prompt_id,response,token_ids\np1,a,"[1, -3]"\n'), "line 2", "token_ids"),
    ("csv-invalid-utf8", "t.csv", lambda p: p.write_bytes(b"prompt_id,response\np1,ok\np1,\xff\n"), "line 3", "response"),
    ("csv-missing-required", "t.csv", text("prompt_id,response\np1,\n"), "line 2", "response_text"),
    # a file cut off inside a quoted cell (landed as a shorter response before), and a header naming a column twice
    # (the last cell won); the line of the record that starts the trouble
    ("csv-cut-off-quote", "t.csv", text('prompt_id,response\np1,ok\np1,"cut\noff'), "line 3", None),
    ("csv-text-after-quote", "t.csv", text('prompt_id,response\np1,"a\nb"\np1,"ab"c\n'), "line 4", None),
    ("csv-duplicate-column", "t.csv", text("prompt_id,response,response\np1,a,b\n"), "line 1", "response"),
]


@pytest.mark.parametrize("case, name, writer, location, field", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_file_location_and_field_and_leaves_the_lake_unchanged(
        ready, lake_dir, tmp_path, monkeypatch, case, name, writer, location, field):
    monkeypatch.setenv("SPOLAKE_MAX_LINE_BYTES", "1000")
    path = tmp_path / name
    writer(path)
    before = lake_state(lake_dir)
    result = ready("ingest", path)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(path) in lines[0]
    if location:
        assert f"{path}:{location}" in lines[0]
    if field:
        assert f"'{field}'" in lines[0]
    assert result.stdout == ""
    assert lake_state(lake_dir) == before


def test_unknown_source_option_is_refused(ready, lake_dir, tmp_path):
    path = tmp_path / "ok.jsonl"
    path.write_text(jsonl([row()]))
    result = ready("ingest", path, "--source", "martian")
    assert result.exit_code == 1 and result.stderr.strip().splitlines() == [
        "error: --source 'martian': unknown (one of human, reference, cot, spo, ppo, grpo, policy, pts_rollout, import, trl-grpo, verl, prime-rl)"]
    assert Lake.open(lake_dir).count("trajectories") == 0
