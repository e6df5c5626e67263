"""Every malformed file is a one-line error naming file, row and field (or a counted skip where the format documents
one), and nothing lands in the lake: deep JSON, lone surrogates, garbage registry rows, malformed dumps, FIFOs."""
from __future__ import annotations

import json
import os
import shutil
import signal
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from spo_lake.lake import Lake
from tests.security.conftest import one_line_error

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(autouse=True)
def no_hang():
    """A refusal must come without blocking (a FIFO read would block forever): fail instead of hanging."""
    def hung(*_):
        raise TimeoutError("blocked")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize(("line", "fragments"), [
    ('{"prompt_id": "p1", "response": "r", "metadata": ' + deep(100000) + "}", ["line 1", "nested deeper"]),
    ('{"prompt_id": "p1", "response": "r", "metadata": {"a": ' + deep(200) + "}}", ["line 1", "field 'metadata'"]),
    ('{"prompt_id": "p1", "response": "r", "trajectory_id": "\\ud800"}', ["line 1", "field 'trajectory_id'",
                                                                          "lone surrogate"]),
    ('{"prompt_id": "\\udfff", "response": "r"}', ["line 1", "field 'prompt_id'"]),
])
def test_hostile_jsonl_is_one_line_and_nothing_lands(filled, world, line, fragments):
    path = world.tmp / "bad.jsonl"
    path.write_text(line + "\n")
    before = world.snapshot()
    one_line_error(filled("ingest", path), *fragments)
    world.contained(before)


def test_deep_json_in_a_csv_cell_is_one_line(filled, world):
    path = world.tmp / "bad.csv"
    path.write_text('prompt_id,response,metadata\np1,r,"' + deep(50000) + '"\n')
    before = world.snapshot()
    one_line_error(filled("ingest", path), "line 2", "field 'metadata'", "nested deeper")
    world.contained(before)


@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_a_fifo_input_is_refused_without_opening_it(filled, world, suffix):
    fifo = world.tmp / f"in.{suffix}"
    os.mkfifo(fifo)
    before = world.snapshot()
    one_line_error(filled("ingest", fifo), "not a regular file")
    world.contained(before)


def test_a_fifo_in_a_dump_is_refused_without_opening_it(filled, world):
    dump = world.tmp / "verl"
    dump.mkdir()
    os.mkfifo(dump / "1.jsonl")
    one_line_error(filled("ingest", "--from", "verl", dump, "--task", "countdown"), "not a regular file")


@pytest.mark.parametrize("versions", ["not json", '{"trajectories": "x"}', "[1, 2]", '{"t": -1}',
                                      '{"t": 99999999999999999999999}', deep(5000)])
def test_a_garbage_snapshot_registry_row_is_one_line_and_doctor_names_it(filled, world, versions):
    lake = Lake.open(world.lake)
    schema = pa.schema(lake.delta("snapshots").schema().to_arrow())
    row = pa.Table.from_pylist([{"name": "evil", "versions": versions, "deleted": False,
                                 "created_at": datetime.now(UTC), "schema_version": 1}], schema=schema)
    write_deltalake(lake.uri("snapshots"), row, mode="append")
    before = world.snapshot()
    for verb in [("snapshot", "list"), ("sql", "SELECT 1", "--snapshot", "s1"),
                 ("vacuum",)]:
        one_line_error(filled(*verb), "snapshot registry", "'evil'", "versions")
    world.contained(before)
    doctor = filled("doctor")
    assert doctor.exit_code == 1 and "'evil'" in doctor.stdout


def prime_dump(world, episode: dict) -> Path:
    dump = world.tmp / "prime"
    shutil.copytree(FIXTURES / "prime-rl" / "run", dump)
    traces = dump / "rollouts" / "step_1" / "train" / "all" / "traces.jsonl"
    traces.write_text(traces.read_text() + json.dumps(episode) + "\n")
    return dump


def fixture_episode() -> dict:
    path = FIXTURES / "prime-rl" / "run" / "rollouts" / "step_0" / "train" / "all" / "traces.jsonl"
    return json.loads(path.read_text().splitlines()[0])


@pytest.mark.parametrize(("change", "field"), [
    ({"run": "run-7"}, "run"), ({"run": {"work": 3}}, "work"), ({"traces": {"a": 1}}, "traces"),
    ({"traces": ["x"]}, "trace 0"), ({"group": [1]}, "group"), ({"errors": 5}, "errors"),
])
def test_a_malformed_prime_rl_episode_is_one_line(filled, world, change, field):
    dump = prime_dump(world, {**fixture_episode(), **change})
    before = world.snapshot()
    one_line_error(filled("ingest", "--from", "prime-rl", dump, "--task", "countdown", "--reward-map", ">=1"),
                   "traces.jsonl:line 2", field)
    world.contained(before)


def test_an_errored_prime_rl_episode_without_message_nodes_is_counted_and_skipped(filled, world):
    episode = fixture_episode()
    trace = {**episode["traces"][0], "nodes": [], "ok": False, "rewards": {}}
    dump = prime_dump(world, {**episode, "id": "e-failed", "ok": False,
                              "errors": [{"message": "model call failed"}], "traces": [trace]})
    result = filled("ingest", "--from", "prime-rl", dump, "--task", "countdown", "--reward-map", ">=1",
                    "--format", "json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[0])
    assert (summary["new"], summary["skipped"]) == (3, 2)  # the fixture's own skip, and this one


@pytest.mark.parametrize(("line", "fragment"), [("seed = 99999999999999999999999999", "seed"),
                                                ("steps = -99999999999999999999999999", "steps"),
                                                ("lr = inf", "lr"), ("top_p = nan", "top_p")])
def test_out_of_range_numbers_in_a_config_are_one_line(filled, world, line, fragment):
    config = world.tmp / "run.toml"
    config.write_text(f'model = "m"\n{line}\n')
    before = world.snapshot()
    one_line_error(filled("train", "--config", config), "run.toml:line 2", fragment)
    world.contained(before)


@pytest.mark.parametrize("tests", [deep(100000), "[1, 2]", "{not json", '"text"'])
def test_a_lake_prompt_whose_tests_are_not_a_json_object_is_one_line(tests):
    """A copied lake bypasses ingest: what the judge reads from it is checked again."""
    from spo_lake.errors import InputError
    from spo_lake.tasks.base import Problem

    with pytest.raises(InputError) as refused:
        Problem.from_row({"prompt_id": "p1", "task": "pyfunc", "prompt": "q", "tests": tests})
    assert str(refused.value) == "prompt 'p1': field 'tests': not a JSON object"


@pytest.mark.parametrize(("record", "fragment"), [
    ({"temperature": 10**23}, "field 'temperature': expected a number"),
    ({"logprobs": [-1, 10**23]}, "at index 1"),
])
def test_numbers_arrow_cannot_hold_are_one_line(filled, world, record, fragment):
    path = world.tmp / "big.jsonl"
    path.write_text(json.dumps({"prompt_id": "p1", "response": "r", **record}) + "\n")
    before = world.snapshot()
    one_line_error(filled("ingest", path), "big.jsonl:line 1", fragment)
    world.contained(before)


@pytest.mark.parametrize(("args", "option"), [
    (("snapshot", "create", "a\udcff"), "--name"), (("sql", "SELECT '\udcff'"), "--query"),
    (("ingest", "t.jsonl", "--run-id", "r\udcff"), "--run-id"),
])
def test_command_line_bytes_that_are_not_utf8_are_one_line(filled, world, args, option):
    """What the shell passes as undecodable bytes arrives as lone surrogates."""
    before = world.snapshot()
    one_line_error(filled(*args), f"{option}: not valid UTF-8 text")
    world.contained(before)
