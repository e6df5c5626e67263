"""The `report` group is one module's: registration order does not change the command tree."""
from __future__ import annotations

import typer

from spo_lake.cli import pipeline_cmds, report_cmds
from spo_lake.cli.app import app


def test_the_report_group_is_one_modules_whatever_registers_first():
    """`report_cmds.register` defines and mounts the whole group, so it needs no other module registered before it."""
    verbs = {"solves", "coverage", "first-solved", "hardest", "batch", "passk"}
    for order in ([report_cmds, pipeline_cmds], [pipeline_cmds, report_cmds], [report_cmds]):
        alone = typer.Typer()
        for module in order:
            module.register(alone)
        group = typer.main.get_command(alone).commands["report"]
        assert set(group.commands) == verbs
    assert set(typer.main.get_command(app).commands["report"].commands) == verbs
