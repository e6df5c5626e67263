
from spo_lake.pipelines.judge import judge, pending
from spo_lake.tasks import Problem, SandboxOptions, get_task
from tests.helpers import add_responses


def _problem(lake, prompt_id):
    row = lake.sql(f"SELECT * FROM prompts WHERE prompt_id = '{prompt_id}'").to_pylist()[0]
    return Problem.from_row(row)


def test_judge_judges_every_trajectory_once(countdown_lake):
    lake = countdown_lake
    p0 = _problem(lake, "countdown/0/0")
    a, b = p0.tests["numbers"][:2]
    add_responses(lake, [
        {"prompt_id": p0.prompt_id, "response": f"{a}+{b}"},                        # legal, almost surely wrong
        {"prompt_id": p0.prompt_id, "response": f"{a}*{a}*{a}"},                     # reuses a number
        {"prompt_id": p0.prompt_id, "response": "__import__('os').system('true')"},  # never evaluated
        {"prompt_id": p0.prompt_id, "response": f"Let me think.\n{a} + {b}"},        # answer on the last line
    ])
    humans = lake.sql("SELECT count(*) AS n FROM trajectories WHERE source = 'human'").to_pylist()[0]["n"]
    report = judge(lake, show_progress=False)
    assert report.evaluated == humans + 4 and report.already_done == 0
    rows = lake.sql("""SELECT t.source, t.response_text, e.* FROM evaluations e JOIN trajectories t USING (trajectory_id)
                       WHERE e.verifier = 'countdown'""").to_pylist()
    assert len(rows) == humans + 4
    assert all(r["passed"] and r["reward"] == 0.0 and r["verdict"] == "ok" for r in rows if r["source"] == "human")
    by_text = {r["response_text"]: r for r in rows if r["source"] == "reference"}
    expect_sum = a + b == p0.tests["target"]
    assert by_text[f"{a}+{b}"]["passed"] is expect_sum
    assert by_text[f"{a}*{a}*{a}"]["passed"] is False and by_text[f"{a}*{a}*{a}"]["reward"] == -1.0
    assert by_text["__import__('os').system('true')"]["verdict"] != "ok"
    assert by_text[f"Let me think.\n{a} + {b}"]["extraction"] == f"{a} + {b}"
    # imported human verdicts stay as their own rows; the real verifier adds rows beside them
    assert lake.sql("SELECT count(*) AS n FROM evaluations WHERE verifier = 'imported'").to_pylist()[0]["n"] == humans

    again = judge(lake, show_progress=False)
    assert again.evaluated == 0 and again.already_done == humans + 4


def test_judge_where_selects_and_resumes(countdown_lake):
    lake = countdown_lake
    first = judge(lake, where="t.prompt_id = 'countdown/0/0'", show_progress=False)
    todo, done, _ = pending(lake)
    assert done == first.evaluated and len(todo) > 0
    rest = judge(lake, show_progress=False)
    assert rest.evaluated == len(todo)


def test_verdict_matches_task_verify(countdown_lake):
    lake = countdown_lake
    judge(lake, show_progress=False)
    row = lake.sql("""SELECT t.response_text, t.prompt_id, e.passed FROM evaluations e JOIN trajectories t USING (trajectory_id)
                      WHERE e.verifier = 'countdown' ORDER BY t.trajectory_id LIMIT 1""").to_pylist()[0]
    direct = get_task("countdown").verify(_problem(lake, row["prompt_id"]), row["response_text"], SandboxOptions())
    assert direct.passed == row["passed"]


def test_poison_and_failed_judgments_are_recorded_and_a_rerun_has_nothing_pending(tmp_path):
    from spo_lake.ingest.datasets import ingest_dataset
    from spo_lake.lake import Lake

    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "humaneval", None, limit=1)
    prompt_id = lake.sql("SELECT prompt_id FROM prompts WHERE task = 'humaneval'").to_pylist()[0]["prompt_id"]
    poisons = [
        "import os, time\ndef has_close_elements(numbers, threshold):\n    os.write(4, b'{\"value\":' + b'[' * 100000)\n"
        "    os.write(4, b'\\n')\n    time.sleep(2)\n",
        "import os\ndef has_close_elements(numbers, threshold):\n    os.write(4, b'{\"nothing\": 1}\\n')\n",
        "import os\ndef has_close_elements(numbers, threshold):\n    os.write(4, b'{\"error\": \"\\\\ud800\\xff\"}\\n')\n",
    ]
    add_responses(lake, [{"prompt_id": prompt_id, "response": f"```python\n{p}```"} for p in poisons])
    # a generous limit: no verdict here is about time (each poison's verdict comes as its message is read, not when
    # its sleep ends), and the human solution must pass however loaded the machine is
    first = judge(lake, options=SandboxOptions(timeout_s=60), show_progress=False)
    rows = lake.sql("""SELECT t.response_text, e.verdict, e.passed FROM evaluations e JOIN trajectories t
                       USING (trajectory_id) WHERE e.verifier = 'humaneval'""").to_pylist()
    assert first.evaluated == len(rows) == 4  # the human solution and the three poisons
    assert sorted(r["passed"] for r in rows) == [False, False, False, True]
    assert all(r["verdict"] in ("ok", "wrong_answer", "runtime_error") for r in rows)
    again = judge(lake, show_progress=False)
    assert again.evaluated == 0 and again.already_done == first.evaluated + first.already_done


def test_judge_skips_what_it_cannot_judge_with_a_count_and_reason_and_judges_the_rest(countdown_lake):
    lake = countdown_lake
    lake.append("prompts", [{"prompt_id": "imported/0", "task": "countdown", "prompt": "a prompt without tests"},
                            {"prompt_id": "imported/1", "task": "mystery", "prompt": "a task nobody knows",
                             "tests": '{"x": 1}'}])
    add_responses(lake, [{"prompt_id": "imported/0", "response": "1+2"}, {"prompt_id": "imported/0", "response": "3"},
                         {"prompt_id": "imported/1", "response": "x"}])
    report = judge(lake, show_progress=False)
    assert report.skipped == {"prompt has no tests": 2, "unknown task 'mystery'": 1}
    assert report.evaluated > 0 and "skipped 2 (prompt has no tests)" in report.summary()
    assert lake.sql("SELECT count(*) AS n FROM evaluations WHERE trajectory_id IN (SELECT trajectory_id FROM "
                    "trajectories WHERE prompt_id LIKE 'imported/%')").to_pylist()[0]["n"] == 0
