"""Tasks: a prompt format plus a verifier. Looked up by the `task` field of a prompt row."""
from __future__ import annotations

import importlib

from spo_lake.errors import UnknownName
from spo_lake.tasks.base import Problem, SandboxOptions, Task, Verdict

# name -> "module:attribute"; imported lazily so a task's heavy imports cost nothing until it is used.
_TASKS = {
    "countdown": "spo_lake.tasks.countdown:TASK",
    "humaneval": "spo_lake.tasks.humaneval:TASK",
    "codecontests": "spo_lake.tasks.codecontests:TASK",
    "taco": "spo_lake.tasks.taco:TASK",
    "pyfunc": "spo_lake.tasks.pyfunc:TASK",
}


def get_task(name: str) -> Task:
    if name not in _TASKS:
        raise UnknownName(f"unknown task {name!r}; known: {', '.join(sorted(_TASKS))}")
    module, attr = _TASKS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def task_names() -> list[str]:
    return sorted(_TASKS)


__all__ = ["Problem", "SandboxOptions", "Task", "Verdict", "get_task", "task_names"]
