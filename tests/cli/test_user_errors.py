"""`user_errors`: what users cause is one line and exit 1; anything else is a bug, shown with its traceback."""
from __future__ import annotations

import pytest
import typer

from spo_lake.cli.common import user_errors
from spo_lake.errors import InputError, UnknownName, UserError
from spo_lake.lake import Lake, LakeError


def test_a_user_error_is_one_line_and_exit_1(capsys):
    @user_errors
    def bad_option() -> None:
        raise InputError("--k 'x': expected comma-separated integers such as 1,10")

    with pytest.raises(typer.Exit) as exit_:
        bad_option()
    assert exit_.value.exit_code == 1
    assert capsys.readouterr().err == "error: --k 'x': expected comma-separated integers such as 1,10\n"


def test_an_unknown_name_reads_as_its_message_not_a_key_repr(capsys):
    @user_errors
    def unknown_task() -> None:
        raise UnknownName("unknown task 'nope'; known: countdown")

    with pytest.raises(typer.Exit):
        unknown_task()
    assert capsys.readouterr().err == "error: unknown task 'nope'; known: countdown\n"


def test_lake_errors_are_user_errors(tmp_path, capsys):
    with pytest.raises(typer.Exit):
        user_errors(lambda: Lake.open(str(tmp_path / "missing")))()
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and issubclass(LakeError, UserError)


def test_a_bug_shows_its_traceback_and_asks_to_report_it(capsys):
    @user_errors
    def buggy() -> None:
        {}["missing"]  # a KeyError from the code, not from the user

    with pytest.raises(typer.Exit) as exit_:
        buggy()
    assert exit_.value.exit_code == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "KeyError: 'missing'" in err
    assert err.splitlines()[-1].startswith("error: a bug in spo-lake") and "please report it" in err
