"""The trailing options of the model and judging verbs are declared once (`RunOptions`) and reach every verb."""
from __future__ import annotations

import re

import pytest

SANDBOX = {"--workers", "--timeout-s", "--memory-mb", "--sandbox"}
MODEL = {"--device", "--threads", "--model-id"}
EXECUTOR = {"--executor", "--ray-address"}
SHARED = {  # each verb's share of RunOptions, as before the bundle
    "sample": {"--seed", "--batch", *MODEL, *SANDBOX, *EXECUTOR, "--format"},
    "q0": {"--seed", "--batch", *MODEL, *SANDBOX, *EXECUTOR, "--format"},
    "pts": {"--seed", *MODEL, *SANDBOX, "--format"},
    "refprobs": {*MODEL, "--format"},
    "judge": {*SANDBOX, *EXECUTOR, "--format"},
}
EVERY = set().union(*SHARED.values())


@pytest.mark.parametrize("verb", SHARED)
def test_each_verb_lists_its_shared_options(spolake, monkeypatch, verb):
    monkeypatch.setenv("COLUMNS", "200")
    result = spolake(verb, "--help")
    assert result.exit_code == 0
    assert set(re.findall(r"(--[a-z0-9-]+)", result.stdout)) & EVERY == SHARED[verb]


@pytest.mark.parametrize("verb, args", [("sample", ["--model", "m"]), ("q0", ["--model", "m"]),
                                        ("pts", ["--model", "m"]), ("judge", [])])
def test_the_shared_options_reach_the_verb(filled, verb, args):
    result = filled(verb, *args, "--sandbox", "bogus", "--timeout-s", "2")  # checked before a model loads
    assert result.exit_code == 1 and result.stderr.strip() == "error: --sandbox 'bogus': bwrap or none"
    assert filled(verb, *args, "--format", "yaml").exit_code == 2
    if "--threads" in SHARED[verb]:
        assert filled(verb, *args, "--threads", "0").exit_code == 2
    # limits that would fail every program (and keep those verdicts) are refused before anything runs
    assert filled(verb, *args, "--workers", "0").exit_code == 2
    for limit in (["--timeout-s", "0"], ["--timeout-s", "-1"], ["--memory-mb", "0"]):
        result = filled(verb, *args, *limit)
        assert result.exit_code == 1 and result.stderr.startswith("error: sandbox limits must be positive"), limit


def test_refprobs_takes_only_the_model_options(filled):
    assert filled("refprobs", "--model", "m", "--threads", "0").exit_code == 2
    assert filled("refprobs", "--model", "m", "--sandbox", "none").exit_code == 2  # no such option here
