import pytest
import typer
from typer.testing import CliRunner

from spo_lake.cli.common import STATE
from spo_lake.cli.model_cmds import register
from spo_lake.ingest.datasets import ingest_dataset
from spo_lake.lake import Lake


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """Invoke the model verbs on a countdown lake; returns (invoke, lake)."""
    lake = Lake.init(tmp_path / "lake")
    ingest_dataset(lake, "countdown", None, n=2, seed=0)
    monkeypatch.setattr(STATE, "lake_path", str(tmp_path / "lake"))
    app = typer.Typer()
    register(app)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args])

    return invoke, lake


def test_the_pipeline_verbs_chain(cli, scripted_model_dir, tmp_path):
    invoke, lake = cli
    model = str(scripted_model_dir)  # a model loaded by path; what it says is not the point
    template = tmp_path / "template.txt"
    template.write_text("Think first.\n{prompt}")

    result = invoke("sample", "--model", model, "--n", 2, "--max-new-tokens", 10, "--source", "cot",
                    "--template", template, "--temperature", 0.7, "--top-p", 0.95, "--evaluate")
    assert result.exit_code == 0, result.output
    assert "sampled 4 responses for 2 prompts" in result.output
    assert lake.sql("SELECT count(*) AS n FROM evaluations e JOIN trajectories t USING (trajectory_id) "
                    "WHERE t.source = 'cot'").column("n")[0].as_py() == 4

    result = invoke("q0", "--model", model, "--k", 3, "--max-new-tokens", 10, "--beta", 0.5)
    assert result.exit_code == 0, result.output
    assert "sampled 6" in result.output and "β=0.5" in result.output

    result = invoke("refprobs", "--model", model, "--where", "t.source = 'cot'")
    assert result.exit_code == 0 and "scored 4 trajectories" in result.output, result.output

    result = invoke("pts", "--model", model, "--k", 2, "--s0-range", 0, 1, "--max-new-tokens", 10,
                    "--where", "t.source = 'reference'")
    assert result.exit_code == 0, result.output
    passed = lake.sql("SELECT count(*) AS n FROM evaluations e JOIN trajectories t USING (trajectory_id) "
                      "WHERE t.source = 'reference' AND e.passed").column("n")[0].as_py()
    assert f"searched {passed} trajectories" in result.output
    kinds = lake.sql("SELECT kind FROM runs WHERE status = 'finished' ORDER BY created_at").column("kind").to_pylist()
    assert kinds == ["sample", "q0", "refprobs", "pts"]


@pytest.mark.parametrize("args, message", [
    (["sample", "--source", "bogus"], "--source 'bogus': unknown"),
    (["sample", "--template", "/no/such/template.txt"], "no such file"),
    (["sample", "--where", "p.nonexistent = 1"], "nonexistent"),
    (["q0", "--k", 0], "k must be at least 1"),
    (["pts", "--threshold", 0], "threshold"),
])
def test_user_mistakes_are_one_line_errors(cli, scripted_model_dir, args, message):
    invoke, _ = cli
    result = invoke(*args[:1], "--model", str(scripted_model_dir), *args[1:])
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output
    assert result.output.strip().startswith("error:") and len(result.output.strip().splitlines()) == 1


def test_an_unloadable_model_is_a_one_line_error(cli, tmp_path):
    invoke, _ = cli
    result = invoke("refprobs", "--model", tmp_path / "missing-model")
    assert result.exit_code == 1 and "no such directory" in result.output and "Traceback" not in result.output
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")  # a directory transformers cannot load
    result = invoke("refprobs", "--model", tmp_path / "broken")
    assert result.exit_code == 1 and result.output.startswith("error: ") and len(result.output.splitlines()) == 1


# builds and trains a transformer
@pytest.mark.integration
def test_model_tiny_builds_a_loadable_model(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["model", "tiny", "--out", str(tmp_path / "tiny"), "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    assert AutoTokenizer.from_pretrained(tmp_path / "tiny").eos_token_id == model.config.eos_token_id


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "tiny model: steps must be at least 1, got 0"),  # a ZeroDivisionError ("a bug") before
    (["--steps", "-5"], "tiny model: steps must be at least 1, got -5"),
    (["--style", "essay"], "unknown tiny-model style 'essay'; use 'direct' or 'cot'"),  # a ValueError's traceback
])
def test_model_tiny_refuses_bad_settings_in_one_line_before_building(tmp_path, args, message):
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["model", "tiny", "--out", str(tmp_path / "tiny"), *args])
    assert result.exit_code == 1 and result.output == f"error: {message}\n", result.output
    assert not (tmp_path / "tiny").exists()


def test_model_tiny_into_a_file_says_so_before_training(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")  # "[Errno 17] File exists" after minutes of training before
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["model", "tiny", "--out", str(tmp_path / "notes.txt"), "--steps", "2"])
    assert result.exit_code == 1 and result.output == f"error: {tmp_path / 'notes.txt'}: a file is there; a model is " \
        "a directory\n", result.output


def test_threads_sets_torch_threads_for_the_verb_and_rejects_zero(cli, scripted_model_dir):
    import torch

    invoke, _ = cli
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        result = invoke("refprobs", "--model", scripted_model_dir, "--threads", 1, "--device", "cpu")
        assert result.exit_code == 0, result.output
        assert torch.get_num_threads() == 1
        result = invoke("refprobs", "--model", scripted_model_dir, "--threads", 0)
        assert result.exit_code == 2 and "--threads" in result.output
    finally:
        torch.set_num_threads(before)
