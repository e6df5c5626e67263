
from spo_lake.ingest import PROMPT_FIELDS, add_prompts, from_records, located
from spo_lake.lake.sql import CANONICAL_SQL
from spo_lake.pipelines.dedup import dedup
from tests.helpers import add_responses

PROGRAM = "def f(x):\n    return x + 1\n"
SAME_PROGRAM_OTHER_LAYOUT = "```python\n# increment\ndef f(x):\n\n        return x+1   # done\n```"
RENAMED = "def f(y):\n    return y + 1\n"


def test_dedup_groups_identical_programs_and_keeps_sources(countdown_lake):
    lake = countdown_lake
    add_prompts(lake, from_records(located([{"prompt_id": "cc/1", "task": "codecontests", "prompt": "inc",
                                             "tests": {"public": [{"input": "1\n", "output": "2\n"}]}}], "t"),
                                   PROMPT_FIELDS, "prompts"))
    add_responses(lake, [{"prompt_id": "cc/1", "response": PROGRAM}], source="human")
    add_responses(lake, [{"prompt_id": "cc/1", "response": SAME_PROGRAM_OTHER_LAYOUT},
                         {"prompt_id": "cc/1", "response": RENAMED}], source="reference")
    report = dedup(lake, show_progress=False)
    total = lake.sql("SELECT count(*) AS n FROM trajectories").to_pylist()[0]["n"]
    assert report.hashed == total
    groups = lake.sql(f"SELECT * FROM ({CANONICAL_SQL}) WHERE prompt_id = 'cc/1' ORDER BY group_size DESC").to_pylist()
    assert [g["group_size"] for g in groups] == [2, 1]
    assert groups[0]["sources"] == ["human", "reference"]
    canonical = lake.sql(f"SELECT response_text FROM trajectories WHERE trajectory_id = '{groups[0]['canonical_trajectory_id']}'")
    assert canonical.to_pylist()[0]["response_text"] == PROGRAM  # the earliest row is canonical
    # raw rows are never deleted, and a second run hashes nothing new
    assert lake.sql("SELECT count(*) AS n FROM trajectories").to_pylist()[0]["n"] == total
    assert dedup(lake, show_progress=False).hashed == 0


def test_countdown_answers_dedup_by_expression(countdown_lake):
    lake = countdown_lake
    add_responses(lake, [{"prompt_id": "countdown/0/0", "response": "1 + 2"},
                         {"prompt_id": "countdown/0/0", "response": "thinking...\n1+2"}])
    dedup(lake, show_progress=False)
    sizes = lake.sql(f"SELECT group_size FROM ({CANONICAL_SQL}) WHERE prompt_id = 'countdown/0/0' AND list_contains(sources, 'reference')").to_pylist()
    assert [s["group_size"] for s in sizes] == [2]
