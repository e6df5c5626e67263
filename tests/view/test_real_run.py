"""A real training run's page: `spolake train` (the fast tiny model, a few steps, online and lake streams, evaluated
at step 0) writes its directory and lake rows, `spolake view` shows them, Chromium opens the page."""
from __future__ import annotations

import re

import pytest

from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
from tests.view.browser import Browser, chromium, require_chromium
from tests.view.conftest import cli

pytestmark = pytest.mark.integration
require_chromium()

CONFIG = """model = "{model}"
steps = 2
batch_size = 4
max_new_tokens = 8
judge_workers = 1
eval_every = 2
eval_where = "TRUE"
eval_n = 2
eval_k = [1, 2]
seed = 0

[[streams]]
name = "online"
kind = "online"
fraction = 0.5

[[streams]]
name = "solutions"
kind = "lake"
fraction = 0.5
where = "source = 'human'"
"""


def test_a_real_runs_page_shows_its_curves_streams_and_rollouts(tmp_path, fast_model_dir):
    lake_dir = tmp_path / "lake"
    lake = Lake.init(lake_dir)
    ingest_dataset(lake, "countdown", None, n=3, seed=0)
    q0(lake, TransformersPolicy.from_pretrained(str(fast_model_dir)), k=2, max_new_tokens=8, show_progress=False)
    (tmp_path / "run.toml").write_text(CONFIG.format(model=fast_model_dir))
    cli(lake_dir, "train", "--config", tmp_path / "run.toml", "--run-dir", tmp_path / "runs", "--run-name", "r1",
        "--quiet")
    cli(lake_dir, "view", "--out", tmp_path / "site", "--runs", tmp_path / "runs", "--quiet")
    page = next((tmp_path / "site" / "runs").glob("r1-*.html"))
    browser = Browser(chromium() or "")
    try:
        browser.open(page)
        assert browser.errors() == []
        charts = dict(browser.eval("[...document.querySelectorAll('div.chart')].map(d => [d.id, "
                                   "d._fullData.map(t => [t.name, t.x])])"))
        assert [name for name, _ in charts["passk"]] == ["pass@1", "pass@2"]
        assert all(x == [0, 2] for _, x in charts["passk"])  # π0 at step 0, then the run's evaluation
        assert charts["curve-loss"][0][1] == [1, 2]
        rows = browser.eval("[...document.querySelectorAll('#streams + table tbody tr')]"
                            ".map(r => [...r.cells].map(c => c.textContent))")
        assert {(r[0], r[1]) for r in rows} == {("online", "online"), ("solutions", "lake")}
        written = browser.eval("[...document.querySelectorAll('#written + table tbody tr')]"
                               ".map(r => [...r.cells].map(c => c.textContent))")
        assert written and all(re.fullmatch(r"\d+", r[3]) for r in written)
    finally:
        browser.close()
