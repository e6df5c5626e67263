"""Dataset loaders and the contest/HumanEval tasks, verified through the real sandbox."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spo_lake.tasks import codecontests, get_task, humaneval, taco
from spo_lake.tasks.base import Problem, SandboxOptions

FIXTURES = Path(__file__).parent.parent / "fixtures"
CC_FILE = FIXTURES / "codecontests" / "train-00000-of-00001.parquet"
TACO_FILE = FIXTURES / "taco" / "train-00000-of-00001.parquet"
OPTIONS = SandboxOptions(timeout_s=5.0, memory_mb=512)


def problems_by_id(prompts: list[dict]) -> dict[str, Problem]:
    return {record["prompt_id"]: Problem.from_row(record) for record in prompts}


def verify(task_name: str, problem: Problem, response: str):
    return get_task(task_name).verify(problem, response, OPTIONS)


def assert_one_line_error(call, *fragments: str) -> None:
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


# ------------------------------------------------------------------------------------------ CodeContests


@pytest.fixture(scope="module")
def cc():
    return codecontests.load(str(FIXTURES / "codecontests"))


def test_codecontests_prompts(cc):
    prompts, _ = cc
    assert [p["prompt_id"] for p in prompts] == [
        "codecontests/1000_A. Sum of Two", "codecontests/1000_B. Maximum", "codecontests/1000_C. Average"]
    first = prompts[0]
    assert first["task"] == "codecontests"
    assert first["prompt"].startswith("Given two integers a and b")
    assert first["tests"] == {
        "public": [{"input": "1 2\n", "output": "3\n"}],
        "private": [{"input": "-5 7\n", "output": "2\n"},
                    {"input": "1000000000 1000000000\n", "output": "2000000000\n"}],
        "generated": [{"input": "0 0\n", "output": "0\n"}],
    }
    assert prompts[1]["tests"]["generated"] == []
    assert [p["time_limit_s"] for p in prompts] == [1.0, 2.0, 1.5]
    assert [p["memory_limit_mb"] for p in prompts] == [256, 256, 64]
    meta = first["metadata"]
    assert meta["source"] == "codeforces" and meta["difficulty"] == "A"
    assert meta["cf_rating"] == 800 and meta["cf_tags"] == ["implementation"] and meta["cf_index"] == "A"
    assert json.loads(json.dumps(prompts)) == prompts  # records are JSON-serialisable as they are


def test_codecontests_keeps_python3_solutions_only(cc):
    _, trajectories = cc
    labels = [(t["prompt_id"][13:19], t["metadata"]["label"], t["reward"]) for t in trajectories]
    # C++ (problem A) and Python 2 (problem B) solutions are skipped
    assert labels == [("1000_A", "correct", 0.0), ("1000_A", "incorrect", -1.0),
                      ("1000_B", "correct", 0.0), ("1000_B", "incorrect", -1.0),
                      ("1000_C", "correct", 0.0), ("1000_C", "incorrect", -1.0)]
    assert all(t["source"] == "human" and t["metadata"]["language"] == "python3" for t in trajectories)
    assert trajectories[2]["response"] == "input()\nprint(max(map(int, input().split())))\n"


def test_codecontests_file_glob_and_limit_agree_with_directory(cc):
    assert codecontests.load(str(CC_FILE)) == cc
    assert codecontests.load(str(FIXTURES / "codecontests" / "*.parquet")) == cc
    prompts, trajectories = codecontests.load(str(CC_FILE), limit=2)
    assert prompts == cc[0][:2]
    assert {t["prompt_id"] for t in trajectories} == {p["prompt_id"] for p in prompts}


def test_codecontests_human_solutions_pass_and_incorrect_ones_fail(cc):
    prompts, trajectories = cc
    problems = problems_by_id(prompts)
    for trajectory in trajectories:
        verdict = verify("codecontests", problems[trajectory["prompt_id"]], trajectory["response"])
        assert verdict.passed == (trajectory["metadata"]["label"] == "correct"), (trajectory, verdict)
        assert verdict.reward == trajectory["reward"]


def test_codecontests_runs_public_then_private_then_generated(cc):
    problem = problems_by_id(cc[0])["codecontests/1000_A. Sum of Two"]
    # right on the public test and the first private one, wrong past 10**9 (the second private test)
    response = "Here is my solution:\n```python\na, b = map(int, input().split())\nprint((a + b) % 10**9)\n```\n"
    verdict = verify("codecontests", problem, response)
    assert (verdict.passed, verdict.verdict, verdict.first_failing_test) == (False, "wrong_answer", 2)
    assert verdict.extracted_code == "a, b = map(int, input().split())\nprint((a + b) % 10**9)\n"
    # the generated test is last: this one passes public and private tests and fails only there
    zero = "a, b = map(int, input().split())\nprint(a + b if a or b else 1)\n"
    assert verify("codecontests", problem, zero).first_failing_test == 3


def test_codecontests_wrong_answers(cc):
    problems = problems_by_id(cc[0])
    average = problems["codecontests/1000_C. Average"]
    assert verify("codecontests", average, "n=int(input());xs=list(map(int,input().split()));print(sum(xs)/n)").passed
    assert verify("codecontests", average, "```python\nprint(2.5)\n```").verdict == "wrong_answer"
    assert verify("codecontests", average, "```python\nprint(\n```").verdict == "syntax"
    assert verify("codecontests", average, "```python\nraise SystemExit(3)\n```").verdict == "runtime_error"


def test_codecontests_task_prompt_and_verifier(cc):
    problem = problems_by_id(cc[0])["codecontests/1000_B. Maximum"]
    task = get_task("codecontests")
    text = task.format_prompt(problem)
    assert text.startswith(problem.prompt) and "standard input" in text and "```python" in text
    assert task.verifier_name(problem) == "stdio"


def test_problem_without_tests_never_passes(cc):
    record = dict(cc[0][0], tests={"public": [], "private": [], "generated": []})
    verdict = verify("codecontests", Problem.from_row(record), "print(3)")
    assert not verdict.passed and "no tests" in verdict.detail


def test_run_limits_take_the_larger_of_problem_and_options(cc):
    average = problems_by_id(cc[0])["codecontests/1000_C. Average"]  # 1.5 s, 64 MB
    assert codecontests.run_limits(average, SandboxOptions(timeout_s=1.0, memory_mb=512)) == (1.5, 512)
    assert codecontests.run_limits(average, SandboxOptions(timeout_s=5.0, memory_mb=32)) == (5.0, 64)


def test_directory_splits_follow_file_names(tmp_path):
    (tmp_path / "data").mkdir()
    shutil.copy(CC_FILE, tmp_path / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pq.read_table(CC_FILE).slice(2), tmp_path / "data" / "valid-00000-of-00001.parquet")
    assert len(codecontests.load(str(tmp_path))[0]) == 3
    assert [p["prompt_id"] for p in codecontests.load(str(tmp_path), split="valid")[0]] == [
        "codecontests/1000_C. Average"]
    assert_one_line_error(lambda: codecontests.load(str(tmp_path), split="test"), str(tmp_path), "'test'", "train")


def test_codecontests_malformed_input(tmp_path):
    table = pq.read_table(CC_FILE)
    missing = tmp_path / "missing.parquet"
    pq.write_table(table.drop_columns(["private_tests"]), missing)
    assert_one_line_error(lambda: codecontests.load(str(missing)), str(missing), "row 0", "'private_tests'")

    uneven = tmp_path / "uneven.parquet"
    rows = table.to_pylist()
    rows[1]["public_tests"] = {"input": ["1\n", "2\n"], "output": ["1\n"]}
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), uneven)
    assert_one_line_error(lambda: codecontests.load(str(uneven)), str(uneven), "row 1", "'public_tests'")

    assert_one_line_error(lambda: codecontests.load(str(tmp_path / "nope.parquet")), "nope.parquet")
    assert_one_line_error(lambda: codecontests.load(str(tmp_path / "*.arrow")), "no files match")
    (tmp_path / "notes.txt").write_text("x")
    assert_one_line_error(lambda: codecontests.load(str(tmp_path / "notes.txt")), "notes.txt", "unsupported")


# -------------------------------------------------------------------------------------------------- TACO


@pytest.fixture(scope="module")
def tc():
    return taco.load(str(TACO_FILE))


def test_taco_prompts(tc):
    prompts, trajectories = tc
    stdio, call = prompts
    assert (stdio["prompt_id"], call["prompt_id"]) == ("taco/train/0", "taco/train/1")
    assert stdio["tests"] == {"public": [], "generated": [], "private": [
        {"input": "abc\n", "output": "cba\n"}, {"input": "racecar\n", "output": "racecar\n"}]}
    assert call["tests"]["fn_name"] == "add"
    assert call["tests"]["private"][0] == {"input": [1, 2], "output": [3]}
    assert (stdio["time_limit_s"], stdio["memory_limit_mb"]) == (1.0, 256)
    assert (call["time_limit_s"], call["memory_limit_mb"]) == (None, None)
    assert stdio["metadata"]["tags"] == ["String algorithms"] and stdio["metadata"]["difficulty"] == "EASY"
    assert stdio["metadata"]["url"].startswith("https://codeforces.com/")
    assert call["metadata"]["starter_code"] == "def add(a, b):\n"
    assert [t["prompt_id"] for t in trajectories] == ["taco/train/0", "taco/train/0", "taco/train/1"]
    assert all(t["reward"] == 0.0 and t["metadata"]["label"] == "correct" for t in trajectories)


def test_taco_split_names_prompt_ids_and_limit():
    prompts, trajectories = taco.load(str(TACO_FILE), split="test", limit=1)
    assert [p["prompt_id"] for p in prompts] == ["taco/test/0"]
    assert len(trajectories) == 2


def test_taco_human_solutions_pass_and_wrong_answers_fail(tc):
    prompts, trajectories = tc
    problems = problems_by_id(prompts)
    for trajectory in trajectories:
        assert verify("taco", problems[trajectory["prompt_id"]], trajectory["response"]).passed, trajectory
    stdio, call = problems["taco/train/0"], problems["taco/train/1"]
    assert verify("taco", stdio, "print(input())").first_failing_test == 0
    assert verify("taco", call, "```python\ndef add(a, b):\n    return a - b\n```").verdict == "wrong_answer"
    assert not verify("taco", call, "def plus(a, b):\n    return a + b\n").passed
    chat = "Sure.\n```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```\nDone."
    assert verify("taco", call, chat).passed


def test_taco_task_prompt_and_verifier(tc):
    problems = problems_by_id(tc[0])
    stdio, call = problems["taco/train/0"], problems["taco/train/1"]
    task = get_task("taco")
    assert (task.verifier_name(stdio), task.verifier_name(call)) == ("stdio", "call")
    assert "standard input" in task.format_prompt(stdio)
    call_text = task.format_prompt(call)
    assert "`add`" in call_text and "```python\ndef add(a, b):\n```" in call_text


@pytest.mark.parametrize("text, seconds", [("1 second", 1.0), ("2 seconds", 2.0), ("1.5 seconds", 1.5),
                                           ("500 ms", 0.5), ("3 s", 3.0), ("1 second(s)", 1.0), ("2", 2.0),
                                           ("None", None), ("", None), (None, None), ("two seconds", None),
                                           ("1-2 seconds", None), ("5 minutes", None)])
def test_parse_time_limit(text, seconds):
    assert taco.parse_time_limit(text) == seconds


@pytest.mark.parametrize("text, megabytes", [("256 megabytes", 256), ("64 MB", 64), ("1 GB", 1024),
                                             ("262144 kilobytes", 256), ("lots", None), (None, None)])
def test_parse_memory_limit(text, megabytes):
    assert taco.parse_memory_limit(text) == megabytes


def test_taco_malformed_input(tmp_path):
    rows = pq.read_table(TACO_FILE).to_pylist()
    schema = pq.read_table(TACO_FILE).schema

    def write(name, mutate):
        broken = [dict(row) for row in rows]
        mutate(broken)
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(broken, schema=schema), path)
        return str(path)

    bad_json = write("bad_json.parquet", lambda r: r[1].update(input_output='{"inputs": [[1, 2]'))
    assert_one_line_error(lambda: taco.load(bad_json), bad_json, "row 1", "'input_output'", "not valid JSON")
    uneven = write("uneven.parquet", lambda r: r[0].update(input_output='{"inputs": ["a"], "outputs": []}'))
    assert_one_line_error(lambda: taco.load(uneven), uneven, "row 0", "'input_output'")
    bad_solutions = write("bad_solutions.parquet", lambda r: r[1].update(solutions='{"a": 1}'))
    assert_one_line_error(lambda: taco.load(bad_solutions), bad_solutions, "row 1", "'solutions'")
    missing = tmp_path / "missing.parquet"
    pq.write_table(pq.read_table(TACO_FILE).drop_columns(["input_output"]), missing)
    assert_one_line_error(lambda: taco.load(str(missing)), str(missing), "row 0", "'input_output'")


# --------------------------------------------------------------------------------------------- HumanEval


@pytest.fixture(scope="module")
def he():
    return humaneval.load()


def test_humaneval_loads_all_164(he):
    prompts, trajectories = he
    assert len(prompts) == len(trajectories) == 164
    assert len({p["prompt_id"] for p in prompts}) == 164
    first = prompts[0]
    assert first["prompt_id"] == "humaneval/HumanEval_0" and first["task"] == "humaneval"
    assert first["tests"]["entry_point"] == "has_close_elements" and "def check(candidate)" in first["tests"]["program"]
    assert trajectories[0]["response"].startswith(first["prompt"]) and trajectories[0]["reward"] == 0.0
    assert get_task("humaneval").format_prompt(Problem.from_row(first)) == first["prompt"]
    assert get_task("humaneval").verifier_name(Problem.from_row(first)) == "humaneval"


@pytest.mark.parametrize("index", [0, 10, 32, 50, 81, 129, 163])  # 10, 32 and 50 have helper functions
def test_humaneval_canonical_solutions_pass(he, index):
    prompts, trajectories = he
    problem = Problem.from_row(prompts[index])
    assert verify("humaneval", problem, trajectories[index]["response"]).passed


def test_humaneval_response_shapes(he):
    problem = Problem.from_row(he[0][0])
    body = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    # a completion model's body continuation
    assert verify("humaneval", problem, body).passed
    # a chat model's full function in a fence, without the prompt's `from typing import List`
    chat = ("Here you go:\n```python\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
            f"{body}```\nThis compares every pair.")
    assert verify("humaneval", problem, chat).passed
    # demo code under a main guard that reads stdin does not break the check
    demo = 'if __name__ == "__main__":\n    print(has_close_elements(eval(input()), 1))\n'
    guarded = chat.replace("```\nThis", demo + "```\nThis")
    assert verify("humaneval", problem, guarded).passed
    wrong = verify("humaneval", problem, "    return False\n")
    assert (wrong.passed, wrong.verdict) == (False, "wrong_answer")
    unclosed = "```python\ndef has_close_elements(numbers, threshold):\n    return (\n```"
    assert verify("humaneval", problem, unclosed).verdict == "syntax"


def test_assemble_program():
    prompt = "from typing import List\n\n\ndef f(xs: List[int]) -> int:\n    \"\"\"Doc.\"\"\"\n"
    assert humaneval.assemble_program(prompt, "    return 1\n", "f") == prompt + "    return 1\n"
    full = "def f(xs: List[int]) -> int:\n    return 2\n"
    assert humaneval.assemble_program(prompt, full, "f") == prompt + "\n" + full
    future = "from __future__ import annotations\n" + full
    assert humaneval.assemble_program(prompt, future, "f") == future
    guarded = full + 'if __name__ == "__main__":\n    f(input())\nprint("kept")\n'
    assert humaneval.assemble_program(prompt, guarded, "f") == prompt + "\n" + full + 'print("kept")\n'


def test_humaneval_from_file_and_malformed_input(he, tmp_path):
    rows = _raw_humaneval(he, 3)
    good = tmp_path / "he.jsonl.gz"
    with gzip.open(good, "wt") as f:
        f.write("".join(json.dumps(row) + "\n\n" for row in rows))
    prompts, trajectories = humaneval.load(str(good))
    assert prompts == he[0][:3] and trajectories == he[1][:3]
    assert len(humaneval.load(str(good), limit=2)[0]) == 2

    missing = tmp_path / "missing.jsonl"
    no_test = {k: v for k, v in rows[1].items() if k != "test"}
    missing.write_text(json.dumps(rows[0]) + "\n" + json.dumps(no_test) + "\n")
    assert_one_line_error(lambda: humaneval.load(str(missing)), str(missing), "row 1", "'test'")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n{oops\n")
    assert_one_line_error(lambda: humaneval.load(str(bad)), str(bad), "row 1", "JSON")
    assert_one_line_error(lambda: humaneval.load(str(tmp_path / "none.jsonl")), "none.jsonl")


def _raw_humaneval(he, n: int) -> list[dict]:
    """Rebuild the package's HumanEval rows from the loaded records, to write them to a file."""
    prompts, trajectories = he
    return [{"task_id": p["metadata"]["task_id"], "prompt": p["prompt"], "entry_point": p["tests"]["entry_point"],
             "canonical_solution": t["response"][len(p["prompt"]):], "test": p["tests"]["program"]}
            for p, t in zip(prompts[:n], trajectories[:n], strict=True)]


@pytest.mark.parametrize("response", ["\x00", "(" * 10_000, "-" * 100_000 + "1", "x=" + "+".join(["1"] * 100_000),
                                      "\ud800", "```python\n" * 1000])
@pytest.mark.parametrize("task_name", ["humaneval", "codecontests"])
def test_hostile_responses_are_judged_not_raised(he, cc, task_name, response):
    problem = Problem.from_row(he[0][0] if task_name == "humaneval" else cc[0][0])
    verdict = verify(task_name, problem, response)
    assert (verdict.passed, verdict.verdict) == (False, "syntax")
