import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spo_lake.models.scripted import ScriptedPolicy
from spo_lake.models.tokens import render_prompt
from spo_lake.pipelines.common import TRAJECTORY_WITH_PROMPT
from spo_lake.pipelines.judge import judge
from spo_lake.pipelines.pts import pts, search
from spo_lake.pipelines.q0 import latest_prompt_values, q0
from spo_lake.tasks import Problem

DENOMINATOR = 20  # estimates are ratios successes/k, like real ones


def counting(values: list[float]):
    calls: Counter = Counter()

    def estimate(t: int) -> float:
        calls[t] += 1
        return values[t]

    return estimate, calls


@settings(max_examples=200, deadline=None)
@given(increments=st.lists(st.integers(0, 8), min_size=1, max_size=80), m=st.integers(1, 10))
def test_monotone_step_function_pivots_are_exactly_the_big_jumps(increments, m):
    # S(t) = (sum of the first t increments) / 20, clipped to 1: a monotone step function of the prefix length.
    total = [0]
    for inc in increments:
        total.append(min(DENOMINATOR, total[-1] + inc))
    values = [c / DENOMINATOR for c in total]
    threshold = m / DENOMINATOR
    estimate, calls = counting(values)

    result = search(len(increments), estimate, threshold)

    expected = [i for i in range(len(increments)) if total[i + 1] - total[i] >= m]
    assert result.pivots == expected
    assert set(calls.values()) <= {1}, "estimate called twice for a position"
    assert set(calls) == set(result.estimates)
    assert all(result.estimates[t] == values[t] for t in result.estimates)


def test_ratio_differences_at_the_threshold_count_despite_rounding():
    assert 6 / 10 - 4 / 10 < 0.2  # float arithmetic: 0.19999999999999996
    result = search(1, lambda t: [0.4, 0.6][t], 0.2)
    assert result.pivots == [0]


def test_one_pivot_costs_logarithmically_many_estimates():
    n, jump = 1024, 517
    estimate, calls = counting([0.3 if t <= jump else 0.9 for t in range(n + 1)])
    result = search(n, estimate, 0.2)
    assert result.pivots == [jump]
    assert len(calls) <= 2 * math.log2(n) + 2  # the two ends, then two halves per level down one path


def test_changes_that_cancel_inside_a_range_are_not_searched():
    # Up at token 0, down at token 1: the range's ends agree, so bisection never looks inside (as in PTS).
    estimate, calls = counting([0.5, 1.0, 0.5])
    assert search(2, estimate, 0.2).pivots == []
    assert set(calls) == {0, 2}


def test_empty_response_estimates_nothing():
    estimate, calls = counting([0.5])
    assert search(0, estimate, 0.2).estimates == {} and not calls


# ---------------------------------------------------------------------------------------------- a real search


@pytest.fixture(scope="module")
def policy(scripted_model_dir) -> ScriptedPolicy:
    return ScriptedPolicy.from_pretrained(str(scripted_model_dir))


def test_pts_writes_consistent_values_pivots_and_rollouts(countdown_lake, policy):
    lake, k, threshold = countdown_lake, 4, 0.25
    q0(lake, policy, k=8, max_new_tokens=12, where="p.prompt_id <> 'countdown/0/3'", show_progress=False)
    judge(lake, where="t.source = 'human'", show_progress=False)  # the solver's answers, judged by countdown
    # one solver answer for each of three prompts, the last without a q0 estimate
    searched_where = """t.trajectory_id IN (SELECT min(trajectory_id) FROM trajectories WHERE source = 'human'
                        AND prompt_id IN ('countdown/0/0', 'countdown/0/1', 'countdown/0/3') GROUP BY prompt_id)"""

    report = pts(lake, policy, k=k, threshold=threshold, where=searched_where, s0_range=(0.0, 1.0),
                 max_new_tokens=12, show_progress=False)
    humans = lake.sql(f"SELECT * FROM ({TRAJECTORY_WITH_PROMPT}) t WHERE {searched_where}").to_pylist()
    with_q0 = [h for h in humans if h["prompt_id"] != "countdown/0/3"]
    assert report.searched == len(with_q0) == 2 and report.no_q0 == 1
    assert report.rollouts > 0  # π0 is far from perfect on these prompts, so S0 and S(T) = 1 differ
    s0 = {r["prompt_id"]: r["n_success"] / r["n"] for r in latest_prompt_values(lake, policy.model_id)}

    rollouts_total = 0
    for h in with_q0:
        tid = h["trajectory_id"]
        prompt_ids, tokens = policy.tokenize_response(render_prompt(Problem.from_row(h)), h["response_text"])
        values = lake.sql(f"""SELECT * FROM "values" WHERE trajectory_id = '{tid}'""").to_pylist()
        rollouts = lake.sql(f"""SELECT t.*, e.passed, e.verifier FROM trajectories t JOIN evaluations e USING (trajectory_id)
                                WHERE t.prefix_trajectory_id = '{tid}'""").to_pylist()
        pivots = lake.sql(f"SELECT * FROM pivots WHERE trajectory_id = '{tid}' ORDER BY position").to_pylist()
        by_position = {v["position"]: v for v in values}
        assert len(by_position) == len(values) and {v["prompt_id"] for v in values} == {h["prompt_id"]}
        assert (by_position[len(tokens)]["n"], by_position[len(tokens)]["n_success"]) == (1, 1)  # its own verdict
        # Replaying the search on the stored estimates visits exactly the stored positions and finds the same pivots.
        stored = {0: s0[h["prompt_id"]], **{p: v["n_success"] / v["n"] for p, v in by_position.items()}}
        replay = search(len(tokens), stored.__getitem__, threshold)
        assert set(replay.estimates) - {0} == set(by_position)
        assert [p["position"] for p in pivots] == replay.pivots
        for p in pivots:
            i = p["position"]
            assert (p["token_id"], p["s_before"], p["s_after"]) == (tokens[i], stored[i], stored[i + 1])
            assert abs(p["s_after"] - p["s_before"]) >= threshold - 1e-9 and p["threshold"] == threshold
        # Every estimate other than the end is k rollouts from that prefix, each judged once by countdown.
        for position, v in by_position.items():
            here = [r for r in rollouts if r["prefix_position"] == position]
            if position == len(tokens):
                assert not here
                continue
            assert v["n"] == len(here) == k and v["n_success"] == sum(r["passed"] for r in here)
            for r in here:
                assert r["token_ids"][:position] == tokens[:position] and r["verifier"] == "countdown"
                assert r["response_text"] == policy.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
                assert (r["source"], r["model_id"], r["temperature"], r["top_p"]) == ("pts_rollout", policy.model_id, 1.0, 1.0)
        rollouts_total += len(rollouts)
    assert report.rollouts == rollouts_total and report.pivots == lake.count("pivots")

    again = pts(lake, policy, k=k, threshold=threshold, where=searched_where, s0_range=(0.0, 1.0),
                max_new_tokens=12, show_progress=False)
    assert again.searched == 0 and again.already_searched == report.searched


def test_pts_says_why_it_skips_trajectories(countdown_lake, policy):
    lake = countdown_lake
    humans = "t.source = 'human' AND t.prompt_id = 'countdown/0/0'"
    q0(lake, policy, k=4, max_new_tokens=12, where="p.prompt_id = 'countdown/0/0'", show_progress=False)
    n = lake.sql(f"SELECT count(*) AS n FROM trajectories t WHERE {humans}").column("n")[0].as_py()
    unverified = pts(lake, policy, k=2, where=humans, s0_range=(0.0, 1.0), show_progress=False)
    assert unverified.searched == 0 and unverified.not_verified == n  # only the imported verdicts so far

    judge(lake, where=humans, show_progress=False)
    s0 = latest_prompt_values(lake, policy.model_id)[0]
    s0 = s0["n_success"] / s0["n"]
    outside = (0.0, s0 - 0.01) if s0 > 0.5 else (s0 + 0.01, 1.0)
    report = pts(lake, policy, k=2, where=humans, s0_range=outside, show_progress=False)
    assert report.searched == 0 and report.outside_s0_range == n and lake.count("pivots") == 0


def test_pts_skips_responses_longer_than_the_generation_limit_instead_of_faking_pivots(countdown_lake, policy):
    """From a prefix of a response longer than max_new_tokens, no continuation could reach the response's end, so
    S(t) near T would read 0 against S(T) = 1: such trajectories are counted and skipped, never searched."""
    lake = countdown_lake
    humans = "t.source = 'human' AND t.prompt_id = 'countdown/0/1'"
    q0(lake, policy, k=4, max_new_tokens=12, where="p.prompt_id = 'countdown/0/1'", show_progress=False)
    judge(lake, where=humans, show_progress=False)
    rows = lake.sql(f"SELECT * FROM ({TRAJECTORY_WITH_PROMPT}) t WHERE {humans}").to_pylist()
    lengths = [len(policy.tokenize_response(render_prompt(Problem.from_row(r)), r["response_text"])[1]) for r in rows]
    limit = min(lengths) - 1  # every solver answer is longer than this
    report = pts(lake, policy, k=2, where=humans, s0_range=(0.0, 1.0), max_new_tokens=limit, show_progress=False)
    assert report.searched == 0 and report.too_long == len(rows) and report.rollouts == 0
    assert "longer than max_new_tokens" in report.summary()
    tids = ", ".join(f"'{r['trajectory_id']}'" for r in rows)
    assert lake.sql(f'SELECT count(*) AS n FROM "values" WHERE trajectory_id IN ({tids})').column("n")[0].as_py() == 0
