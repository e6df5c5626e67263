"""`spolake train --help-config` lists every training key with its default and meaning, read from the code, and
docs/config.md holds the same tables (regenerate: `python -m spo_lake.cli.config_help docs/config.md`)."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from typer.testing import CliRunner

from spo_lake.cli.app import app
from spo_lake.cli.config_help import BEGIN, END, markdown
from spo_lake.rl.config import KEYS, StreamConfig, TrainConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def rows(text: str) -> dict[str, tuple[str, str]]:
    """{key: (default, meaning)} of the Markdown key tables in `text`."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(" | ")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("| key", "| ---"):
            out[cells[0].removeprefix("| ")] = (cells[1], cells[2].removesuffix(" |").removesuffix("|").strip())
    return out


def test_help_config_lists_every_key_with_its_default_and_a_meaning():
    result = CliRunner().invoke(app, ["train", "--help-config"])
    assert result.exit_code == 0, result.output
    listed = rows(result.stdout)
    assert set(KEYS) | {f.name for f in fields(StreamConfig)} <= set(listed)
    assert all(meaning for _, meaning in listed.values()), [k for k, (_, m) in listed.items() if not m]
    defaults = TrainConfig()
    assert listed["eval_n"][0] == str(defaults.eval.n) and listed["algorithm"][0] == '"spo"'
    assert listed["rollout_lag"][1].startswith("(config.rollout.lag) ")  # a key that differs from its field says so


def test_docs_config_md_holds_the_generated_tables():
    text = DOC.read_text()
    generated = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert generated == markdown().strip(), "docs/config.md is out of date: python -m spo_lake.cli.config_help " \
                                            "docs/config.md"


def test_every_written_meaning_names_a_field_that_has_no_comment():
    """MEANINGS only fills gaps: an entry for a renamed field, or for one that has its own comment now, goes."""
    from spo_lake.cli.config_help import MEANINGS, field_comments
    from spo_lake.rl.config import SECTIONS

    classes = {**SECTIONS, "streams": StreamConfig}
    for entry in MEANINGS:
        section, name = entry.split(".")
        assert name in {f.name for f in fields(classes[section])}, entry
        assert not field_comments(classes[section]).get(name), f"{entry}: the field has its own comment now"
