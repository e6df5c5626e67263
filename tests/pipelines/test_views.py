"""Lake analytics views on a real lake with known rows: exact numbers."""
import subprocess
import sys
from pathlib import Path

import pytest

from spo_lake.demo.chain import _known
from spo_lake.ingest import TRAJECTORY_FIELDS, from_records, ingest_trajectories, located
from spo_lake.lake import Lake
from spo_lake.pipelines.dedup import dedup
from spo_lake.pipelines.judge import judge
from spo_lake.pipelines.views import (
    coverage,
    first_solved,
    hardest_solved,
    plot_coverage,
    plot_solves,
    prompt_solves,
    solves_over_snapshots,
)

NOT_HUMAN = "t.source <> 'human'"


def add(lake: Lake, rows: list[tuple[str, str]], source: str, run_id: str) -> None:
    records = [{"prompt_id": f"countdown/0/{p}", "response": r} for p, r in rows]
    batch = from_records(located(records, "test"), TRAJECTORY_FIELDS, "trajectories")
    ingest_trajectories(lake, batch, source=source, defaults={"model": "m", "run_id": run_id})
    judge(lake, show_progress=False)
    dedup(lake, show_progress=False)


@pytest.fixture
def lake(countdown_lake) -> Lake:
    """Solver solutions (s0), then a reference pass (s1), then a training run's rollouts (s2), and π0's Q0 counts.
    Prompt 0's solution is 9+2*17, prompt 2's is 11+7; '(x)' is the same value but another program."""
    lake = countdown_lake
    judge(lake, show_progress=False)
    dedup(lake, show_progress=False)
    lake.snapshot("s0")
    add(lake, [(0, "1+1"), (2, "11+7"), (2, "11 + 7"), (2, "(11+7)")], "reference", "p1")
    lake.snapshot("s1")
    add(lake, [(0, "(9+2*17)"), (0, "9+2*17  "), (2, "1+1"), (2, "1+2")], "spo", "r1")
    lake.snapshot("s2")
    lake.append("values", [{"prompt_id": f"countdown/0/{p}", "trajectory_id": None, "position": None,
                            "model_id": "pi0", "temperature": 1.0, "top_p": 1.0, "n": 8, "n_success": s,
                            "run_id": "q"} for p, s in enumerate([1, 0, 4, 2])])
    return lake


def test_solves_over_snapshots_count_prompts_solve_rates_and_distinct_programs(lake, tmp_path):
    table = solves_over_snapshots(lake, ["s0", "s1", "s2"], NOT_HUMAN).to_pylist()
    # s0: nothing but human rows. s1: p0 0/1; p2 3/3 with 2 programs ('11 + 7' is '11+7' once normalised, '(11+7)'
    # is another). s2: p0 2/3 with 2 programs; p2 3/5 with 2 programs.
    assert table == [
        {"snapshot": "s1", "group": "all", "prompts": 2, "solved": 1, "mean_solve_rate": 0.5,
         "mean_distinct_correct": 1.0},
        {"snapshot": "s2", "group": "all", "prompts": 2, "solved": 2, "mean_solve_rate": round((2 / 3 + 3 / 5) / 2, 4),
         "mean_distinct_correct": 2.0},
    ]
    per_source = {(r["grp"], r["prompt_id"]): (r["samples"], r["correct"], r["distinct_correct"])
                  for r in prompt_solves(lake, "s2", NOT_HUMAN, "source").to_pylist()}
    assert per_source == {("reference", "countdown/0/0"): (1, 0, 0), ("reference", "countdown/0/2"): (3, 3, 2),
                          ("spo", "countdown/0/0"): (2, 2, 2), ("spo", "countdown/0/2"): (2, 0, 0)}
    plot_solves(solves_over_snapshots(lake, ["s1", "s2"], NOT_HUMAN, "source"), tmp_path / "solves.png")
    assert (tmp_path / "solves.png").stat().st_size > 0


def test_a_where_takes_bound_parameters_as_the_chain_demo_selects_runs(lake):
    def counts(rows):
        return {r["prompt_id"]: (r["samples"], r["correct"]) for r in rows}

    runs = "t.run_id IN (SELECT unnest($runs::VARCHAR[]))"
    assert counts(prompt_solves(lake, "s2", runs, params={"runs": ["r1", "it's"]}).to_pylist()) == {
        "countdown/0/0": (2, 2), "countdown/0/2": (2, 0)}
    # The chain demo's known solutions: the reference pass, plus the spo rollouts of the runs given (by directory)
    assert counts(_known(lake, 0, [])) == {"countdown/0/0": (1, 0), "countdown/0/2": (3, 3)}
    assert counts(_known(lake, 0, [Path("runs") / "r1"])) == {"countdown/0/0": (3, 2), "countdown/0/2": (5, 3)}
    assert counts(_known(lake, 0, [Path("runs") / "r2"])) == counts(_known(lake, 0, []))


def test_coverage_and_first_solved_per_source_and_run(lake, tmp_path):
    assert first_solved(lake, "s2", NOT_HUMAN).select(["prompt_id", "source", "run_id"]).to_pylist() == [
        {"prompt_id": "countdown/0/0", "source": "spo", "run_id": "r1"},
        {"prompt_id": "countdown/0/2", "source": "reference", "run_id": "p1"}]
    assert coverage(lake, "s2", NOT_HUMAN).to_pylist() == [
        {"source": "reference", "run_id": "p1", "prompts_solved": 1, "first_solved": 1},
        {"source": "spo", "run_id": "r1", "prompts_solved": 1, "first_solved": 1}]
    # with the solver's solutions, every prompt was solved first by them
    rows = {r["source"]: (r["prompts_solved"], r["first_solved"]) for r in coverage(lake, "s2").to_pylist()}
    assert rows == {"human": (4, 4), "reference": (1, 0), "spo": (1, 0)}
    assert coverage(lake, "s1", NOT_HUMAN).column("source").to_pylist() == ["reference"]
    plot_coverage(coverage(lake, "s2"), tmp_path / "coverage.png")
    assert (tmp_path / "coverage.png").stat().st_size > 0


def test_hardest_solved_prompts_are_ordered_by_pi0s_success_rate(lake):
    rows = hardest_solved(lake, None, NOT_HUMAN, pi0="pi0").to_pylist()
    assert [(r["prompt_id"], r["q0_rate"], r["solved_by"], r["correct"]) for r in rows] == [
        ("countdown/0/0", 0.125, ["spo"], 2), ("countdown/0/2", 0.5, ["reference"], 3)]
    everyone = hardest_solved(lake, None, None, limit=2).to_pylist()  # the solver solved prompt 1, Q0 = 0/8
    assert [(r["prompt_id"], r["q0_rate"]) for r in everyone] == [("countdown/0/1", 0.0), ("countdown/0/0", 0.125)]
    assert hardest_solved(lake, None, None, pi0="another model").num_rows == 0


@pytest.mark.integration  # a spolake process per report verb, each drawing its plot
def test_the_report_commands_print_the_views_and_draw_them(lake, tmp_path):
    def report(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "spo_lake.cli.app", "--lake", lake.root, "report", *args],
                              capture_output=True, text=True, timeout=1200)

    coverage_csv = report("coverage", "--snapshot", "s2", "--where", NOT_HUMAN, "--format", "csv",
                          "--png", str(tmp_path / "c.png"))
    assert coverage_csv.returncode == 0, coverage_csv.stderr
    assert coverage_csv.stdout.splitlines() == ['"source","run_id","prompts_solved","first_solved"',
                                                '"reference","p1",1,1', '"spo","r1",1,1']
    assert (tmp_path / "c.png").stat().st_size > 0
    solves = report("solves", "--snapshots", "s1,s2", "--where", NOT_HUMAN, "--format", "csv",
                    "--png", str(tmp_path / "s.png"))
    assert solves.returncode == 0 and solves.stdout.splitlines()[1] == '"s1","all",2,1,0.5,1'
    assert (tmp_path / "s.png").stat().st_size > 0
    bad = report("solves", "--group-by", "model")
    assert bad.returncode == 1 and "--group-by 'model': one of all, source, run_id" in bad.stderr
