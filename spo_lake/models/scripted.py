"""A scripted policy: a PolicyBackend whose distribution is written down rather than learned, with no forward pass.

It exists for plumbing: the pipelines, the lake and the CLI behave the same whatever model feeds them, and a test
of them should not spend minutes building and running a transformer (tests/conftest.py's `scripted_model_dir`).
It is a real backend: a real tokenizer (the tiny model's BPE recipe, built in milliseconds over its responses),
seeded sampling at any temperature and top-p, teacher-forced scoring, and token-exact continuations, all from one
distribution, so what a pipeline records can be checked against `score` exactly as for a transformer.

The distribution: a prompt (through a chat template that ends in RESPONSE_MARKER, so the response's start is
known in any token sequence) is answered with one of the scripted `responses`. At each step, with the tokens
generated so far, the next token is the next token of a scripted response that starts with them (each such
response equally likely; EOS after a whole one), with probability 1 − epsilon; epsilon is spread over the whole
vocabulary, so any response (an ingested human one) has a finite log-prob. Off the script, the mass 1 − epsilon
goes to EOS: a stray response ends soon.

A directory holds one (`write_scripted_model`): its tokenizer files and a config.json whose model_type is
MODEL_TYPE; `spo_lake.models.load_policy` loads it by path like any model, so `spolake sample --model DIR`, Ray
workers (spo_lake.rollouts.PolicySpec) and model ids work unchanged. It has no weights: `load_weights` refuses.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from spo_lake.errors import InputError
from spo_lake.models.backend import SampleResult, TokenizerPrompts, check_settings, per_prompt
from spo_lake.models.identity import model_identity
from spo_lake.models.sampling import sampling_log_probs
from spo_lake.models.tiny import build_tokenizer

MODEL_TYPE = "spo_lake_scripted"
RESPONSE_MARKER = "<|response|>"
# The prompt inside a chat template (encode_prompt applies it): BOS, the prompt, then the marker the response follows.
CHAT_TEMPLATE = "<s>{% for m in messages %}{{ m['content'] }}{% endfor %}" + RESPONSE_MARKER


def write_scripted_model(out_dir: str | Path, responses: Sequence[str], epsilon: float = 0.05) -> Path:
    """Write a scripted model that answers every prompt with one of `responses` (see the module doc)."""
    if not responses or not 0 < epsilon < 1:
        raise InputError(f"a scripted model needs responses and 0 < epsilon < 1 (got {len(responses)}, {epsilon})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(list(responses))
    tokenizer.add_special_tokens({"additional_special_tokens": [RESPONSE_MARKER]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    config = {"model_type": MODEL_TYPE, "responses": list(responses), "epsilon": epsilon}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def is_scripted(directory: str | Path) -> bool:
    """Whether `directory` holds a scripted model (write_scripted_model)."""
    config = Path(directory) / "config.json"
    try:
        return json.loads(config.read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):  # no file, not JSON, not an object: not ours (its loader says why)
        return False


class ScriptedPolicy(TokenizerPrompts):
    """See the module doc. Deterministic: the same calls with the same seeds return the same results anywhere."""

    def __init__(self, tokenizer, responses: Sequence[str], epsilon: float, model_id: str):
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.source: str | None = None
        self.device = torch.device("cpu")
        self.precision = ("scripted", "float32")
        self.epsilon = epsilon
        self.marker = tokenizer.convert_tokens_to_ids(RESPONSE_MARKER)
        eos = tokenizer.eos_token_id
        self.script = [tokenizer(r, add_special_tokens=False).input_ids + [eos] for r in responses]

    @classmethod
    def from_pretrained(cls, path: str, model_id: str | None = None) -> ScriptedPolicy:
        if not is_scripted(path):
            raise InputError(f"model {path}: not a scripted model directory (config.json model_type {MODEL_TYPE})")
        config = json.loads((Path(path) / "config.json").read_text())
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        policy = cls(tokenizer, config["responses"], config["epsilon"], model_id or model_identity(path))
        policy.source = str(Path(path).resolve())
        return policy

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        raise InputError(f"{self.model_id} is a scripted model: it has no weights to load")

    # ------------------------------------------------------------------------------------- the distribution

    def log_probs(self, sequence: Sequence[int]) -> torch.Tensor:
        """[V] log-probs of the next token after `sequence` (prompt ids, the marker, the response so far)."""
        last = max((i for i, t in enumerate(sequence) if t == self.marker), default=None)
        if last is None:
            raise InputError("a scripted model continues only sequences holding its prompt's response marker")
        done = list(sequence[last + 1 :])
        following = [r[len(done)] for r in self.script if len(r) > len(done) and r[: len(done)] == done]
        vocab = len(self.tokenizer)
        probs = torch.full((vocab,), self.epsilon / vocab, dtype=torch.float64)
        for token in following or [self.tokenizer.eos_token_id]:
            probs[token] += (1 - self.epsilon) / max(len(following), 1)
        return probs.log().float()

    # ------------------------------------------------------------------------------------- sampling

    def sample(self, prompts: Sequence[str], n: int = 1, temperature: float | Sequence[float] = 1.0,
               top_p: float = 1.0, max_new_tokens: int = 256, stop: Sequence[str] | None = None, seed: int = 0
               ) -> list[SampleResult]:
        check_settings(n, temperature, top_p, max_new_tokens)
        temperatures = per_prompt(temperature, len(prompts))
        encoded = [self.encode_prompt(p) for p in prompts]
        generator = torch.Generator().manual_seed(seed)
        return [self._draw(i, encoded[i], temperatures[i], top_p, max_new_tokens, list(stop or []), generator)
                for i in range(len(prompts)) for _ in range(n)]

    def sample_continuations(self, prefixes: Sequence[Sequence[int]], temperature: float = 1.0, top_p: float = 1.0,
                             max_new_tokens: int = 256, stop: Sequence[str] | None = None, seed: int = 0
                             ) -> list[SampleResult]:
        check_settings(1, temperature, top_p, max_new_tokens)
        generator = torch.Generator().manual_seed(seed)
        return [self._draw(i, list(p), temperature, top_p, max_new_tokens, list(stop or []), generator)
                for i, p in enumerate(prefixes)]

    def _draw(self, index: int, prefix: list[int], temperature: float, top_p: float, max_new_tokens: int,
              stop: list[str], generator: torch.Generator) -> SampleResult:
        tokens: list[int] = []
        chosen: list[float] = []
        untempered: list[float] = []
        finish = "length"
        for _ in range(max_new_tokens):
            model = self.log_probs(prefix + tokens)
            sampled_from = sampling_log_probs(model.unsqueeze(0), temperature, top_p)[0]
            token = int(torch.multinomial(sampled_from.exp(), 1, generator=generator))
            tokens.append(token)
            chosen.append(float(sampled_from[token]))
            untempered.append(float(model[token]))
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            if token == self.tokenizer.eos_token_id or any(s in text for s in stop):
                finish = "stop"
                break
        return SampleResult(prompt_index=index, token_ids=tokens, logprobs=chosen, finish_reason=finish,
                            text=self.tokenizer.decode(tokens, skip_special_tokens=True), policy_logprobs=untempered)

    # ------------------------------------------------------------------------------------- scoring

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], batch_size: int = 16
              ) -> list[list[float]]:
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"score: {len(prompt_ids)} prompts but {len(response_ids)} responses")
        return [[float(self.log_probs(list(p) + list(r[:i]))[t]) for i, t in enumerate(r)]
                for p, r in zip(prompt_ids, response_ids)]
