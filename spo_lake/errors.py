"""What users cause. The CLI reports a `UserError` as one line and exit code 1; any other exception is a bug in
spo-lake and shows its traceback (see `spo_lake.cli.common.user_errors`)."""
from __future__ import annotations


class UserError(Exception):
    """Something the user must fix: bad input, an option or config value, a query, a missing or damaged lake."""


class InputError(UserError, ValueError):
    """A value the user gave (an option, a config or recipe key, a file's content) is wrong; the message says which
    and why. A ValueError too, so callers that catch ValueError keep working."""


class UnknownName(UserError, KeyError):
    """A name the user gave (a task, a table) that does not exist. A KeyError too, for lookups' callers."""

    def __str__(self) -> str:  # the message itself, not KeyError's repr of it
        return str(self.args[0]) if self.args else ""
