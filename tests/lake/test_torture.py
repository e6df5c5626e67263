"""Bounded torture test (about a minute and a half on 2 cores; runs in CI, deselect with `-m "not torture"`):
rounds of concurrent `spolake` processes mixing ingest (new and repeated files), evaluate, dedup, q0 on the tiny
model, snapshot, compact and vacuum, while readers query latest and every snapshot in a loop. Afterwards: no
duplicate fact, no lost row, every snapshot reads what readers saw in it, every command exited 0 or with one line."""
from __future__ import annotations

import json
import subprocess
import threading

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from tests.lake.test_concurrent_commits import SPOLAKE, assert_each_row_once, run_all

ROUNDS, ROWS_PER_FILE = 2, 40


def write_responses(path, n: int, tag: str) -> None:
    """n responses to the lake's countdown problems (so evaluate and dedup have real work)."""
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"prompt_id": f"countdown/0/{i % 4}", "response": f"<answer>{tag} {i}</answer>",
                                 "reward": -1.0}) + "\n")


def read_loop(root: str, stop: threading.Event, seen: dict[str, set[int]], failures: list[str]) -> None:
    """Count trajectories at latest and at every snapshot until stopped; a failure must be a one-line error."""
    while not stop.is_set():
        for snap in [None, *seen]:
            args = [SPOLAKE, "--lake", root, "sql", "SELECT count(*) AS n FROM trajectories", "--format", "json"]
            done = subprocess.run(args + (["--snapshot", snap] if snap else []), capture_output=True, text=True,
                                  timeout=1200)
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
                if len(errors) != 1 or "Traceback" in done.stderr:
                    failures.append(done.stderr)
            elif snap:
                seen[snap].add(json.loads(done.stdout)[0]["n"])
        listed = subprocess.run([SPOLAKE, "--lake", root, "snapshot", "list", "--format", "json"],
                                capture_output=True, text=True, timeout=1200)
        for s in json.loads(listed.stdout) if listed.returncode == 0 else []:
            seen.setdefault(s["name"], set())


@pytest.mark.torture
def test_mixed_concurrent_commands_keep_the_lake_exact(tmp_path, fast_model_dir):
    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=4, seed=0)
    base = lake.count("trajectories")
    model = ["--model", str(fast_model_dir)]
    seen: dict[str, set[int]] = {}
    failures: list[str] = []
    stop = threading.Event()
    reader = threading.Thread(target=read_loop, args=(lake.root, stop, seen, failures))
    reader.start()
    try:
        for r in range(ROUNDS):
            files = [tmp_path / f"r{r}-{k}.jsonl" for k in range(2)]
            for k, f in enumerate(files):
                write_responses(f, ROWS_PER_FILE, f"{r}-{k}")
            ingest = ["--task", "countdown", "--source", "policy"]
            commands = [["ingest", str(files[0]), *ingest], ["ingest", str(files[1]), *ingest],
                        ["ingest", str(files[0]), *ingest],  # the same file twice at once
                        ["evaluate"], ["dedup"], ["q0", *model, "--k", str(r + 1), "--max-new-tokens", "16"],
                        ["snapshot", "create", f"round-{r}"], ["compact"], ["vacuum", "--retention-hours", "0"]]
            results = run_all(lake.root, [], commands)  # checks every failure is a one-line error
            # Failures allowed: none of these conflicts is the user's to resolve, so every command must succeed.
            assert [rc for rc, _ in results] == [0] * len(commands), [(c, e[-300:]) for c, (rc, e) in
                                                                       zip(commands, results) if rc]
    finally:
        stop.set()
        reader.join(timeout=300)
    assert not failures, failures[0]

    # No lost row and no duplicate: every ingested file once, q0's quota exactly, one fact per key.
    assert assert_each_row_once(lake) == base + ROUNDS * 2 * ROWS_PER_FILE + 4 * ROUNDS
    for table, key in [("evaluations", "trajectory_id, verifier"), ("duplicates", "trajectory_id, method"),
                       ("prompts", "prompt_id")]:
        got = lake.sql(f"SELECT count(*) AS n, count(DISTINCT ({key})) AS d FROM {table}").to_pylist()[0]
        assert got["n"] == got["d"], (table, got)
    per_prompt = lake.sql("SELECT count(*) AS n FROM trajectories WHERE source = 'reference' GROUP BY prompt_id")
    assert set(per_prompt.column("n").to_pylist()) == {ROUNDS}  # q0 --k 2 in the last round: 2 samples per prompt
    # Every snapshot reads as it did whenever a reader saw it, and holds each row once.
    for name in (s.name for s in lake.snapshots()):
        n = assert_each_row_once(lake, name)
        assert seen.get(name, set()) <= {n}, (name, seen[name], n)
