"""What every task shares: a problem record, a verdict, and the Task protocol.

A task is a prompt format plus a verifier. The verifier that judges a trajectory follows from the
prompt's task (and, for contest tasks, from the shape of its tests), so `evaluate` never needs to be told.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from spo_lake.errors import InputError

VERDICTS = ("ok", "wrong_answer", "runtime_error", "timeout", "memory", "syntax", "output_limit", "sandbox_error")


@dataclass(frozen=True)
class Problem:
    """One row of the `prompts` table, with `tests` and `metadata` parsed from JSON."""

    prompt_id: str
    task: str
    prompt: str
    tests: dict[str, Any] = field(default_factory=dict)
    time_limit_s: float | None = None
    memory_limit_mb: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Problem:
        def parse(name: str) -> dict[str, Any]:
            """A JSON-object column; a lake from elsewhere may hold anything there: a one-line error naming it."""
            v = row.get(name)
            if v is None or v == "":
                return {}
            try:
                value = json.loads(v) if isinstance(v, str) else dict(v)
            except (ValueError, TypeError, RecursionError):
                value = None
            if not isinstance(value, dict):
                raise InputError(f"prompt {str(row['prompt_id'])[:100]!r}: field {name!r}: not a JSON object")
            return value

        return cls(
            prompt_id=row["prompt_id"],
            task=row["task"],
            prompt=row["prompt"],
            tests=parse("tests"),
            time_limit_s=row.get("time_limit_s"),
            memory_limit_mb=row.get("memory_limit_mb"),
            metadata=parse("metadata"),
        )


@dataclass(frozen=True)
class Verdict:
    """The verifier's judgement of one response. reward is 0 for a pass and -1 otherwise (paper §5)."""

    passed: bool
    verdict: str
    first_failing_test: int | None = None
    detail: str = ""
    duration_s: float = 0.0
    extracted_code: str = ""

    @property
    def reward(self) -> float:
        return 0.0 if self.passed else -1.0


@dataclass(frozen=True)
class SandboxOptions:
    """Limits applied to every sandboxed run of one evaluation. mode='none' runs unsandboxed (never the default)."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    mode: str = "bwrap"

    def __post_init__(self) -> None:
        # a zero or negative limit would fail every program, and the lake would keep those verdicts
        if not self.timeout_s > 0 or self.memory_mb < 1:
            raise InputError(f"sandbox limits must be positive: timeout_s {self.timeout_s}, memory_mb {self.memory_mb}")


class Task(Protocol):
    name: str

    def format_prompt(self, problem: Problem) -> str:
        """The text the policy is conditioned on."""

    def verifier_name(self, problem: Problem) -> str:
        """The name recorded in `evaluations.verifier` for this problem (e.g. 'stdio', 'call', 'humaneval')."""

    def verify(self, problem: Problem, response: str, options: SandboxOptions) -> Verdict:
        """Judge one response; any generated code runs only inside the sandbox."""
