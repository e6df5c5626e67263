"""`spolake train` and `spolake eval`: configs and flags, one-line errors, and the example configs."""
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from spo_lake.cli.common import STATE
from spo_lake.cli.train_cmds import register
from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake
from spo_lake.models.backend import TransformersPolicy
from spo_lake.pipelines.q0 import q0
from spo_lake.rl.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def prepared_lake(tmp_path_factory, fast_model_dir) -> Path:
    path = tmp_path_factory.mktemp("cli") / "lake"
    lake = Lake.init(path)
    ingest_dataset(lake, "countdown", None, n=3, seed=0)
    q0(lake, TransformersPolicy.from_pretrained(str(fast_model_dir)), k=2, max_new_tokens=8, show_progress=False)
    return path


@pytest.fixture
def invoke(prepared_lake, monkeypatch):
    monkeypatch.setattr(STATE, "lake_path", str(prepared_lake))
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args])


def test_train_reads_a_toml_config_with_flag_and_set_overrides(invoke, prepared_lake, fast_model_dir, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(f'model = "{fast_model_dir}"\nsteps = 50\nbatch_size = 2\nmax_new_tokens = 8\n'
                      f'loss = "squared"\njudge_workers = 1\n')
    result = invoke("train", "--config", config, "--steps", 2, "--run-dir", tmp_path / "runs", "--run-name", "cli",
                    "--set", "lr=1e-5", "--set", "streams.online.kind=online", "--set", "streams.online.fraction=1.0",
                    "--quiet")
    assert result.exit_code == 0, result.output
    assert "run cli finished at step 2" in result.output
    manifest = json.loads((tmp_path / "runs" / "cli" / "manifest.json").read_text())
    assert manifest["config"]["steps"] == 2 and manifest["config"]["lr"] == 1e-5 and manifest["snapshot"] == "cli"
    lake = Lake.open(prepared_lake)
    assert lake.get_snapshot("cli").versions == manifest["snapshot_versions"]  # the run pinned its own snapshot
    statuses = lake.sql("SELECT status FROM runs WHERE run_id = 'cli' ORDER BY created_at").column("status").to_pylist()
    assert statuses == ["running", "finished"]


@pytest.mark.parametrize("args, message", [
    (["--set", "bogus=1"], "error: config: unknown key(s) ['bogus']"),
    (["--set", "steps=0"], "error: config: steps must be >= 1, got 0"),
    (["--set", 'steps="many"'], "error: config: steps must be int, got 'many'"),
    (["--config", "missing.toml"], "error: config file missing.toml not found"),
    (["--resume", "not-a-run"], "error: --resume not-a-run: no manifest.json there"),
    (["--set", 'prompts_where="nope = 1"'], "error: prompts_where (nope = 1):"),
])
def test_train_reports_user_mistakes_in_one_line(invoke, fast_model_dir, tmp_path, args, message):
    result = invoke("train", "--model", fast_model_dir, "--run-dir", tmp_path, "--quiet", *args)
    assert result.exit_code == 1
    assert result.output.startswith(message) and result.output.count("\n") == 1, result.output


@pytest.mark.parametrize("streams, shown", [('[streams.online]\nkind = "online"\n', "a table"),
                                             ("streams = 3\n", "3")])
def test_streams_not_written_as_an_array_of_tables_are_one_line_naming_the_line(invoke, fast_model_dir, tmp_path,
                                                                               streams, shown):
    # `--set streams.online.kind=...` reads like a TOML table; in a file a stream is a [[streams]] table with a name
    config = tmp_path / "run.toml"
    config.write_text(f'model = "{fast_model_dir}"\nsteps = 2\n{streams}')
    result = invoke("train", "--config", config, "--run-dir", tmp_path, "--quiet")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {config}:line 3: config: streams must be [[streams]] tables")
    assert result.output.rstrip().endswith(f"not {shown}")


def test_eval_prints_pass_at_k_and_records_the_run(invoke, prepared_lake, fast_model_dir):
    result = invoke("eval", "--model", fast_model_dir, "--n", 4, "--k", "1,4", "--max-new-tokens", 8,
                    "--where", "p.prompt_id <> 'countdown/0/2'", "--workers", 1)
    assert result.exit_code == 0, result.output
    assert "2 prompts × 4 samples: pass@1=" in result.output and "pass@4=" in result.output
    run = Lake.open(prepared_lake).sql("SELECT * FROM runs WHERE kind = 'eval' AND status = 'finished'").to_pylist()
    assert len(run) == 1 and set(json.loads(run[0]["metrics"])) >= {"pass@1", "pass@4", "eval_reward"}
    bad = invoke("eval", "--model", fast_model_dir, "--n", 4, "--k", "1,10")
    assert bad.exit_code == 1 and "every k in 1..n" in bad.output
    # without --k, the default 1,10 keeps to the samples there are
    few = invoke("eval", "--model", fast_model_dir, "--n", 3, "--max-new-tokens", 8, "--no-save", "--workers", 1,
                 "--format", "json")
    assert few.exit_code == 0, few.output
    assert set(json.loads(few.stdout)["pass_at_k"]) == {"1", "3"}


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_load_and_keep_every_key_known(path):
    config = load_config(path)
    assert isinstance(config, TrainConfig) and config.model.path
    assert sum(s.fraction for s in config.data.streams) == pytest.approx(1.0)
