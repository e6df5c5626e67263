"""What a policy is conditioned on and what it emits, as text and token ids: prompt rendering, the tokenizer's
content id, and a stored trajectory's token ids under a given model (a sampled response's row:
spo_lake.rollouts.engine.Rollout)."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from spo_lake.models.backend import PolicyBackend
from spo_lake.tasks import Problem, get_task


def tokenizer_id(model: PolicyBackend) -> str:
    """Content id of the model's tokenizer (its token -> id map): equal for models that share a tokenizer, so
    their token ids can be reused across them."""
    vocab = sorted(model.tokenizer.get_vocab().items())
    return "vocab-" + hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def render_prompt(problem: Problem, template: str | None = None) -> str:
    """The text the policy is conditioned on: the task's prompt format, inside `template`'s {prompt} if given."""
    text = get_task(problem.task).format_prompt(problem)
    return template.replace("{prompt}", text) if template else text


def trajectory_token_ids(model: PolicyBackend, tok_id: str, row: dict[str, Any]) -> tuple[list[int], list[int], bool]:
    """(prompt ids, response ids, whether the text had to be tokenised) of a trajectory row joined with its prompt,
    under the model's tokenizer: the row's own token ids when they belong to it, else its text tokenised. The prompt
    is the task's plain format (what a trainer conditions on), even for rows sampled under a template."""
    prompt = render_prompt(Problem.from_row(row))
    if row["token_ids"] is not None and row["tokenizer_id"] == tok_id:
        return model.encode_prompt(prompt), list(row["token_ids"]), False
    return (*model.tokenize_response(prompt, row["response_text"]), True)
