"""Model identity: one model, one `model_id`, however its path is spelt; a misspelt local path is an error."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spo_lake.cli.app import app
from spo_lake.models.identity import is_local, model_identity, resolve_model


@pytest.fixture
def models(tmp_path, scripted_model_dir, monkeypatch):
    """A model (the scripted one: identity and loading by path do not depend on what it computes) as ./models/pi0
    of a fresh working directory."""
    shutil.copytree(scripted_model_dir, tmp_path / "models" / "pi0")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "models"


def test_spellings_of_one_directory_are_one_model(models):
    ids = {model_identity(m) for m in ("models/pi0", "./models/pi0", str(models / "pi0"), "models/../models/pi0")}
    assert len(ids) == 1
    (only,) = ids
    assert only.startswith(f"{models / 'pi0'}@") and len(only.rsplit("@", 1)[1]) == 12


def test_a_copy_elsewhere_and_a_model_rebuilt_in_place_are_other_models(models):
    before = model_identity("models/pi0")
    shutil.copytree(models / "pi0", models / "copy")
    assert model_identity("models/copy") != before
    weights = models / "pi0" / "tokenizer.json"  # any file of the model, as a weights file is
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one changed byte, same size
    weights.write_bytes(bytes(data))
    assert model_identity("models/pi0") != before
    (models / "pi0" / "README.md").write_text("notes")  # documentation is not content
    rebuilt = model_identity("models/pi0")
    (models / "pi0" / "README.md").write_text("other notes")
    assert model_identity("models/pi0") == rebuilt


def test_big_weight_files_are_sampled_not_read_whole(tmp_path):
    model = tmp_path / "big"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with (model / "model.safetensors").open("wb") as fh:
        fh.truncate(3 << 30)  # 3 GiB, sparse
    read_before = _bytes_read()
    model_identity(str(model))
    assert _bytes_read() - read_before < 16 << 20  # 16 samples of 64 KiB, not 3 GiB: counted, not timed


def _bytes_read() -> int:
    """Bytes this process has read through read() calls (Linux's /proc/self/io `rchar`, page cache included)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["rchar"])


@pytest.mark.parametrize("name", ["models/pi1", "./models/pi0-typo", "../elsewhere/pi0", "/no/such/model",
                                  "~/no-such-model-dir", "models/pi0/checkpoints/step-1", "a/b/c", "with space"])
def test_a_local_looking_path_that_does_not_exist_is_an_error_without_hub_access(models, name):
    assert is_local(name)
    with pytest.raises(ValueError, match=r"^model .*: no such directory \("):
        resolve_model(name)


def test_hub_names_stay_hub_names(models):
    assert not is_local("gpt2") and not is_local("Qwen/Qwen2.5-0.5B-Instruct")
    assert resolve_model("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"


def test_a_directory_without_config_is_not_a_model(models):
    (models / "empty").mkdir()
    with pytest.raises(ValueError, match="has no config.json"):
        resolve_model("models/empty")


def test_cli_misspelt_model_is_one_line_and_exit_1(models):
    result = CliRunner().invoke(app, ["--lake", "lake", "q0", "--model", "models/pi1", "--k", "4"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"error: model models/pi1: no such directory ({models / 'pi1'})"]


def test_q0_reuses_samples_whatever_the_spelling_and_model_id_names_an_older_id(models):
    runner = CliRunner()
    lake = ["--lake", "lake"]
    assert runner.invoke(app, [*lake, "prompts", "add", "--dataset", "countdown", "--n", "3", "--seed", "0"]).exit_code == 0
    q0 = ["q0", "--k", "8", "--max-new-tokens", "24", "--format", "json"]
    sampled = []
    for spelling in ("models/pi0", "./models/pi0", str(models / "pi0")):
        result = runner.invoke(app, [*lake, *q0, "--model", spelling])
        assert result.exit_code == 0, result.stderr
        sampled.append(json.loads(result.stdout)["sampled"])
    assert sampled == [24, 0, 0]
    # an id an older lake holds (the path as typed) keeps being extended with --model-id
    legacy = runner.invoke(app, [*lake, *q0, "--model", "models/pi0", "--model-id", "models/pi0"])
    assert json.loads(legacy.stdout)["sampled"] == 24
    again = runner.invoke(app, [*lake, *q0, "--model", "./models/pi0", "--model-id", "models/pi0"])
    assert json.loads(again.stdout)["sampled"] == 0
