from math import comb

from spo_lake.pipelines.judge import judge
from spo_lake.pipelines.report import passk_counts, passk_table
from tests.helpers import add_responses


def test_passk_report_matches_brute_force(countdown_lake):
    lake = countdown_lake
    rows = []
    for i in range(3):
        pid = f"countdown/0/{i}"
        sol = lake.sql(f"SELECT response_text FROM trajectories WHERE prompt_id = '{pid}' LIMIT 1").to_pylist()[0]["response_text"]
        rows += [{"prompt_id": pid, "response": sol}] * (i + 1) + [{"prompt_id": pid, "response": "1+1+1+1+1"}] * 2
    add_responses(lake, rows, model="m1")
    judge(lake, show_progress=False)
    counts = [r for r in passk_counts(lake, "source") if r["grp"] == "reference"]
    assert sorted((r["n"], r["c"]) for r in counts) == [(3, 1), (4, 2), (5, 3)]
    table = {r["group"]: r for r in passk_table(passk_counts(lake, "source"), [1, 4]).to_pylist()}
    ref = table["reference"]

    def brute(n: int, c: int, k: int) -> float:
        return 1 - comb(n - c, k) / comb(n, k)

    assert abs(ref["pass@1"] - round((1 / 3 + 2 / 4 + 3 / 5) / 3, 4)) < 1e-9
    assert ref["prompts@4"] == 2 and abs(ref["pass@4"] - round((brute(4, 2, 4) + brute(5, 3, 4)) / 2, 4)) < 1e-9
    assert table["human"]["pass@1"] == 1.0
