"""Real `spolake` processes: concurrent ingests into one lake, and ingests killed with SIGKILL at random moments."""
from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spo_lake.lake import Lake, table_names

SPOLAKE = str(Path(sys.executable).with_name("spolake"))


def write_input(path: Path, n: int, prompt_id: str, tokens: int = 8) -> None:
    """n trajectories of one new prompt (created from the 'prompt' field), each with an imported reward."""
    rng = random.Random(prompt_id)
    with path.open("w") as fh:
        for i in range(n):
            ids = [rng.randrange(50_000) for _ in range(tokens)]
            fh.write(json.dumps({"prompt_id": prompt_id, "prompt": f"solve {prompt_id}", "response": f"print({i})\n",
                                 "token_ids": ids, "logprobs": [-0.5] * tokens, "reward": float(-(i % 2))}) + "\n")


def spolake(lake: Path, *args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([SPOLAKE, "--lake", str(lake), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def counts(lake: Path) -> dict[str, int]:
    """Rows per table, through SQL over every table (so the whole lake must be readable)."""
    opened = Lake.open(lake)
    query = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t}" for t in table_names())
    return {r["t"]: r["n"] for r in opened.sql(query).to_pylist()}


@pytest.mark.integration  # many spolake processes at once
def test_concurrent_ingests_lose_no_row_and_fail_no_command(tmp_path):
    lake = tmp_path / "lake"
    files = []
    for k in range(3):
        files.append(tmp_path / f"part{k}.jsonl")
        write_input(files[-1], 300, f"p{k}")
    procs = [spolake(lake, "ingest", str(f), "--task", "countdown", "--source", "policy") for f in [*files, files[0]]]
    outputs = [p.communicate(timeout=1200) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outputs
    new = [int(re.search(r": (\d+) new, (\d+) already present", err).group(1)) for _, err in outputs]
    assert sum(new) == 900  # the duplicated input counts once, whichever process committed it
    got = counts(lake)
    assert (got["trajectories"], got["evaluations"], got["prompts"]) == (900, 900, 3)
    ids = Lake.open(lake).sql("SELECT count(DISTINCT trajectory_id) AS d FROM trajectories").to_pylist()
    assert ids == [{"d": 900}]


@pytest.mark.integration  # many spolake processes, one after another
def test_sigkill_during_ingest_leaves_all_or_nothing_and_a_retry_completes(tmp_path):
    n, data = 6000, tmp_path / "big.jsonl"
    write_input(data, n, "pk", tokens=100)
    args = ("ingest", str(data), "--task", "countdown", "--source", "policy")

    start = time.monotonic()  # a full run on a scratch lake times the kills
    assert spolake(tmp_path / "scratch", *args).wait(timeout=1200) == 0
    full = time.monotonic() - start

    # Kill at random moments until two kills landed. A run that finished first (the machine got faster) is checked
    # the same way, then the kills come earlier and the next try starts from a fresh lake: the verdict never
    # depends on how fast the machine is.
    rng = random.Random(0)
    killed, tries, lake = 0, 0, tmp_path / "lake-0"
    assert spolake(lake, "init").wait(timeout=1200) == 0
    while killed < 2:
        tries += 1
        assert tries <= 20, f"no kill landed in {tries} tries"
        proc = spolake(lake, *args)
        time.sleep(full * rng.uniform(0.3, 0.9))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed += 1
        proc.wait(timeout=60)
        got = counts(lake)
        assert got["trajectories"] in (0, n)
        assert got["evaluations"] in (0, n)  # every row carries a reward: one imported verdict each
        assert got["prompts"] in (0, 1)
        if got["trajectories"] == n:  # complete: the next try needs a fresh lake and an earlier kill
            full *= 0.7
            lake = tmp_path / f"lake-{tries}"
            assert spolake(lake, "init").wait(timeout=1200) == 0

    retry = spolake(lake, *args)
    _, err = retry.communicate(timeout=1200)
    assert retry.returncode == 0, err
    assert re.search(r": \d+ new, \d+ already present", err)
    got = counts(lake)
    assert (got["trajectories"], got["evaluations"], got["prompts"]) == (n, n, 1)
    opened = Lake.open(lake)
    assert opened.sql("SELECT count(DISTINCT trajectory_id) AS d FROM trajectories").to_pylist() == [{"d": n}]
    opened.vacuum(orphan_age_hours=0)  # files of the killed writers go; the data stays
    assert counts(lake)["trajectories"] == n


def test_bad_input_in_a_real_process_is_one_line_and_exit_code_1(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_id": "p1", "response": "a", "reward": NaN}\n')
    proc = spolake(tmp_path / "lake", "ingest", str(bad))
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 1 and out == ""
    assert err.splitlines() == [f"error: {bad}:line 1: field 'reward': value nan is not finite"]
