"""The lake's user-facing error, and deltalake's error text made one line."""
from __future__ import annotations

import re

from spo_lake.errors import UserError

_FRAME = re.compile(r"^\s*\d+: |^\s+at ")  # a Rust backtrace frame ("  3: <unknown>", "    at ./nptl/...")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


class LakeError(UserError, RuntimeError):
    """A lake-level problem the user must fix (no lake, unknown snapshot, name taken, damaged table, ...)."""


def delta_message(exc: BaseException | str) -> str:
    """deltalake's message without the Rust backtrace frames some errors carry, on one line."""
    lines = [ln for ln in _COLOUR.sub("", str(exc)).splitlines() if not _FRAME.match(ln)]
    return " ".join(" ".join(lines).split())
