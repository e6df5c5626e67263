"""The demo's pieces that can be checked without training: equal online budgets, configs that load, the report."""

from spo_lake.demo.report import pts_curve, table_rows, write_report
from spo_lake.demo.run import FULL, QUICK, _toml, methods, run_config
from spo_lake.lake import Lake
from spo_lake.rl.config import load_config, stream_counts


def test_every_method_gets_the_same_online_budget(tmp_path):
    for scale in (QUICK, FULL):
        per_step = set()
        for name, method in methods(scale).items():
            path = tmp_path / "c.toml"
            path.write_text(_toml(run_config(name, method, tmp_path, scale, seed=3)))
            config = load_config(path)
            counts = dict(zip((s.name for s in config.streams), stream_counts(config)))
            per_step.add(counts["online"])
            assert config.seed == 3 and config.snapshot == "demo-3" and config.eval_n == 20
            assert config.eval_k == [1, 10] and config.eval_temperature == 0.4 and config.eval_top_p == 0.95
        assert per_step == {scale.online_per_step}


def test_report_has_the_table_plots_and_a_pts_curve(tmp_path):
    lake = Lake.init(tmp_path / "lake")
    lake.append("trajectories", [{"trajectory_id": "t1", "prompt_id": "p", "source": "reference",
                                  "response_text": "1+2", "response_hash": "h"}])
    lake.append("values", [{"prompt_id": "p", "trajectory_id": "t1", "position": pos, "model_id": "m",
                            "temperature": 1.0, "top_p": 1.0, "n": 4, "n_success": s} for pos, s in [(1, 0), (2, 3), (3, 4)]])
    lake.append("pivots", [{"trajectory_id": "t1", "model_id": "m", "position": 1, "token_id": 7, "s_before": 0.0,
                            "s_after": 0.75, "threshold": 0.2}])
    lake.snapshot("demo-0")
    curve = pts_curve(lake, "demo-0")
    assert [p["s"] for p in curve["points"]] == [0.0, 0.75, 1.0] and len(curve["pivots"]) == 1
    methods_ = [{"method": m, "pass1": 0.2, "pass10": 0.5, "gap": 0.3, "wall_s": 10.0, "peak_rss_mb": 900.0,
                 "online_samples": 96, "curve": [{"step": 6, "pass@1": 0.1, "pass@10": 0.4},
                                                 {"step": 12, "pass@1": 0.2, "pass@10": 0.5}]} for m in ("A", "B")]
    summary = {"seed": 0, "quick": True, "recipe_seconds": 1.0, "total_seconds": 2.0, "methods": methods_,
               "recipe_steps": [{"step": "snapshot", "summary": "ok", "seconds": 0.1}]}
    report = write_report(tmp_path, lake, summary, "demo-0").read_text()
    assert "| A | 0.200 | 0.500 | 0.300 |" in report and "pts_curve.png" in report
    for png in ("pass_at_k.png", "pts_curve.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table_rows([{**methods_[0], "pass1": None, "gap": None}])[0][1] == "–"
