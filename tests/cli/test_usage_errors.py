"""What a user can get wrong on the command line ends as ONE line naming the option, key or file, and exit 1 — never
a traceback and "a bug in spo-lake". Each case below raised a bare exception before (a ValueError, torch's
RuntimeError for a device name, a JSONDecodeError), or named the wrong option."""
from __future__ import annotations

import pytest


def one_line_error(result, *fragments: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "a bug in spo-lake" not in result.stderr
    assert all(f in lines[0] for f in fragments), lines[0]
    return lines[0]


def test_resume_with_a_config_is_one_line_before_the_lake_is_opened(spolake, lake_dir, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('model = "m"\n')
    result = spolake("train", "--resume", tmp_path / "runs" / "r1", "--config", config)
    one_line_error(result, "--resume continues the run's recorded config; drop --config")
    assert not lake_dir.exists()  # checked before anything is opened


@pytest.mark.parametrize("args", [("train", "--device", "bogus"), ("eval", "--model", "m", "--device", "bogus")])
def test_a_misspelt_device_flag_is_one_line(spolake, args):
    one_line_error(spolake(*args), "--device 'bogus': not a device")


def test_a_misspelt_device_in_a_config_names_the_file_and_key(spolake, tmp_path):
    assert spolake("init").exit_code == 0
    config = tmp_path / "run.toml"
    config.write_text('model = "m"\ndevice = "cdua"\n')
    one_line_error(spolake("train", "--config", config), f"{config}: device 'cdua': not a device")


def test_a_damaged_tiny_model_record_is_one_line(spolake, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tiny_config.json").write_text("{not json")
    one_line_error(spolake("model", "tiny", "--out", tmp_path / "m", "--steps", "1"),
                   "tiny_config.json: not a tiny-model record", "delete the directory to rebuild")


@pytest.mark.parametrize("option", ["--retention-hours", "--orphan-age-hours"])
def test_a_negative_vacuum_window_is_one_line(spolake, option):
    assert spolake("init").exit_code == 0
    one_line_error(spolake("vacuum", option, "-1"), f"{option} -1: must be 0 or more")


def test_pipeline_set_names_its_own_option(spolake, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("[vars]\nx = 1\n")
    line = one_line_error(spolake("pipeline", "run", recipe, "--set", "x"), "--set expects name=value, got 'x'")
    assert "--map" not in line  # it said `--map expects dst=src`


@pytest.mark.parametrize("args", [("prompts", "add", "--dataset", "humaneval", "--limit", "-1"),
                                  ("prompts", "add", "--dataset", "countdown", "--n", "0"),
                                  ("eval", "--model", "m", "--max-prompts", "-1")])
def test_a_count_below_one_is_a_usage_error(spolake, lake_dir, args):
    """`--limit -1` loaded every problem but the last (a Python slice); `--max-prompts -1` reached DuckDB's LIMIT."""
    result = spolake(*args)
    said = " ".join(result.stderr.replace("│", " ").split())  # typer's usage box wraps at 80 columns
    assert result.exit_code == 2 and f"Invalid value for '{args[-2]}'" in said and "greater than or equal to 1" in said
    assert not lake_dir.exists()
