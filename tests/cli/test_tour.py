"""The README's ten-minute tour, run as written: its shell block is read from README.md and run by bash in a fresh
directory laid out like the repository root. Two things differ from a newcomer's run, both said in the README: the
tiny model is the test session's build (copied to models/pi0, where `spolake model tiny` finds and keeps it), and
the `spolake train` line gets `--set steps=2` appended (the config's full length is not a test's business)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SHORTEN_TRAINING = " --set steps=2"


def tour_script() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## A ten-minute tour", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return block


@pytest.mark.slow  # `spolake model tiny` keeps only a build of the default configuration
def test_the_readme_tour_runs_as_written(tmp_path, tiny_model_dir):
    script = tour_script()
    train = [line for line in script.splitlines() if line.startswith("spolake train ")]
    assert len(train) == 1
    script = script.replace(train[0], train[0] + SHORTEN_TRAINING)
    for shared in ("examples", "configs"):
        (tmp_path / shared).symlink_to(ROOT / shared)
    (tmp_path / ".venv").symlink_to(sys.prefix)  # the environment running the tests, as scripts/setup.sh makes it
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "pi0")
    env = {k: v for k, v in os.environ.items() if k not in ("SPOLAKE_LAKE", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"  # `spolake` must come from the tour's own `source .venv/bin/activate`
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=3600)  # a bound for a hang, not a speed test: loaded runs take long
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]

    # what the README says these lines print or leave behind
    assert "lake ready at" in out
    assert "examples/samples.jsonl: 6 new, 0 already present" in out
    assert "examples/samples.jsonl: 0 new, 6 already present" in out
    assert "models/pi0: already built with this configuration, kept" in out
    assert (tmp_path / "exp1_sft" / "dataset_info.json").is_file()
    assert re.search(r"pass@1=\d\.\d{4}, pass@10=\d\.\d{4}", out)
    assert (tmp_path / "runs" / "tour" / "checkpoints").is_dir()
    assert "SyntaxWarning" not in out and "Traceback" not in out
