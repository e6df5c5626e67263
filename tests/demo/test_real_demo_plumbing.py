"""`spolake demo --model smollm2`'s plumbing on the real SmolLM2-135M-Instruct, at a few problems and one step: the
lake (reference solutions, the second source, π0's Q0 samples, refprobs), the strata fixed before training, two arms
at two lrs each with its evaluations, and the report over them. No assertion on a sampling outcome."""
import dataclasses
import json
import os
import shutil

import pytest

from spo_lake.demo.experiment import SMOLLM2
from spo_lake.demo.report import write_report
from spo_lake.demo.run import run_seed
from spo_lake.lake import Lake

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_real_demo_builds_the_lake_trains_two_arms_at_two_lrs_and_reports(smollm2_dir, tmp_path):
    root = tmp_path / "out"
    shutil.copytree(smollm2_dir, root / "models" / "smollm2", copy_function=os.link)  # the import, kept
    scale = dataclasses.replace(SMOLLM2.quick, train_prompts=2, eval_prompts=2, q0_samples=1, train_steps=1,
                                eval_every=1, eval_max_prompts=2, eval_n=2, max_new_tokens=12, lrs=(1e-6, 1e-5))
    summary = run_seed(root / "seed-0", scale, 0, print, 1, SMOLLM2, ("GRPO", "SPO half-online"))
    lake = Lake.open(str(root / "seed-0" / "lake"))
    sources = {r["source"]: r["n"] for r in lake.sql(
        "SELECT source, count(*) AS n FROM trajectories WHERE prompt_id LIKE 'pyfunc/2/%' GROUP BY 1", "demo-0"
    ).to_pylist()}
    assert sources["human"] == 2 and sources["import"] == 2 and sources["reference"] >= 2  # π0's Q0 samples
    fixed = json.loads((root / "seed-0" / "groups.json").read_text())
    assert set(fixed["groups"]) == {f"pyfunc/{s}/{i}" for s in (0, 2) for i in range(2)}
    assert set(fixed["strata"]["prompts"].values()) <= {"never", "rare", "common", "unmeasured"}
    assert [(m["method"], m["lr"]) for m in summary["methods"]] == [
        ("GRPO", 1e-6), ("GRPO", 1e-5), ("SPO half-online", 1e-6), ("SPO half-online", 1e-5)]
    for m in summary["methods"]:
        assert [p["step"] for p in m["curve"]] == [0, 1] and m["online_reward"] is not None
    report = write_report(root, [summary], {"quick": True, "experiment": "smollm2",
                                            "scale": dataclasses.asdict(scale)})
    assert [r[0] for r in report["table"]["rows"]] == ["π0", "GRPO", "SPO half-online"]
    assert "never+rare pass@1" in report["table"]["columns"] and len(report["lr_sweep"]) == 4
    text = (root / "report.md").read_text()
    assert "## Learning-rate sweep" in text and "## What this run can and cannot say" in text
    assert (root / "pass_at_k.png").read_bytes()[:4] == b"\x89PNG"
