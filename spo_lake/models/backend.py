"""Policy backends: the interface every sampler/scorer implements, and the transformers one.

A backend samples responses (reporting the log-probs of the distribution it actually sampled from, i.e.
after temperature and top-p) and scores given responses by teacher forcing. Conventions shared by all:

- prompts are plain text; a tokenizer's chat template is applied when it has one;
- a response's token_ids include the token that ended it (EOS, or the token completing a stop string), so
  token_ids, logprobs and `score` line up one to one; `text` is decode(token_ids) without special tokens,
  so it keeps a stop string that ended it;
- results come back grouped by prompt: prompt 0's n samples, then prompt 1's, ...;
- `sample_continuations` continues given token ids instead: a token-exact prefix (a prompt plus part of a response)
  cannot pass through text, since re-tokenising it (and a chat template) would change it.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from spo_lake.errors import InputError
from spo_lake.models.decode import decode
from spo_lake.models.identity import model_identity, resolve_model
from spo_lake.models.sampling import gather_token_log_probs, positions_from_mask

# transformers >= 5.x renames forward's `past_key_values` to `cache` and warns on every call; the old name is what
# every supported version (>= 4.45) accepts, so it stays, without a warning per sampled token batch.
warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)


@dataclass(frozen=True)
class SampleResult:
    prompt_index: int
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token under the sampled-from (tempered, top-p) distribution
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    text: str
    # of each sampled token under the model itself (temperature 1, no top-p): the π_old of importance ratios;
    # None when the backend cannot report both at once (callers then score the tokens)
    policy_logprobs: list[float] | None = None


class PolicyBackend(Protocol):
    model_id: str
    # (backend, dtype) of its forward pass: log-probs cached from one precision are not reused by another
    precision: tuple[str, str]
    # the model's transformers tokenizer: decoding token ids, its vocabulary (spo_lake.models.tokens.tokenizer_id)
    tokenizer: Any
    # where the model runs (a torch.device, or vLLM's device name); str() of it is e.g. "cpu" or "cuda:0"
    device: torch.device | str
    # the directory or hub name it was loaded from (what another process loads), None when built from objects
    source: str | None

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids the model is conditioned on for this prompt text (chat template applied if any)."""

    def tokenize_response(self, prompt: str, response: str, add_eos: bool = True) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids) for a text-only trajectory, so it can be scored."""

    def sample(
        self,
        prompts: Sequence[str],
        n: int = 1,
        temperature: float | Sequence[float] = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        seed: int = 0,
    ) -> list[SampleResult]:
        """n samples per prompt, len(prompts) * n results grouped by prompt. `temperature` is one for all or one per
        prompt (prompts at different temperatures share batches)."""

    def sample_continuations(self, prefixes: Sequence[Sequence[int]], temperature: float = 1.0, top_p: float = 1.0,
                             max_new_tokens: int = 256, stop: Sequence[str] | None = None, seed: int = 0
                             ) -> list[SampleResult]:
        """One sampled continuation of each token-id prefix (prompt ids, then any response tokens already fixed),
        all drawn from generators seeded by `seed`; result i continues prefixes[i] (its prompt_index is i) and its
        token_ids are the new tokens only."""

    def score(
        self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], batch_size: int = 16
    ) -> list[list[float]]:
        """Per-response-token log-probs under the model (teacher forcing), one list per response."""

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the weights by a transformers state_dict of the same model (a trainer's new policy version)."""


def _prompt_text(tokenizer, prompt: str) -> tuple[str, bool]:
    """(text to tokenize, whether the tokenizer should add its special tokens): the chat template when the
    tokenizer has one (it brings its own special tokens), else the bare prompt."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), False
    return prompt, True


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids a model is conditioned on for this prompt text."""
    text, special = _prompt_text(tokenizer, prompt)
    return tokenizer(text, add_special_tokens=special).input_ids


def tokenize_response(tokenizer, prompt: str, response: str, add_eos: bool = True) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of a text-only trajectory. Prompt+response are tokenized jointly (as a model
    would have produced them) and split at the prompt; if the joint ids do not start with the prompt's ids
    (a merge across the boundary), the response is tokenized alone. EOS ends the response, as it ends a
    sampled one."""
    prompt_ids = encode_prompt(tokenizer, prompt)
    text, special = _prompt_text(tokenizer, prompt)
    joint = tokenizer(text + response, add_special_tokens=special).input_ids
    if joint[: len(prompt_ids)] == prompt_ids:
        response_ids = joint[len(prompt_ids) :]
    else:
        response_ids = tokenizer(response, add_special_tokens=False).input_ids
    if add_eos and tokenizer.eos_token_id is not None:
        response_ids = response_ids + [tokenizer.eos_token_id]
    return prompt_ids, response_ids


def _resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        raise InputError(f"unknown dtype {dtype!r}; use e.g. 'float32', 'bfloat16'")
    return getattr(torch, dtype)


def check_settings(n: int, temperature: float | Sequence[float], top_p: float, max_new_tokens: int) -> None:
    temperatures = [temperature] if isinstance(temperature, int | float) else list(temperature)
    if min(temperatures, default=0) < 0 or not 0 < top_p <= 1 or n < 1 or max_new_tokens < 1:
        raise InputError(
            f"bad sampling settings: n={n} temperature={temperature} top_p={top_p} max_new_tokens={max_new_tokens}"
        )


def per_prompt(temperature: float | Sequence[float], prompts: int) -> list[float]:
    """One temperature per prompt, from one for all or a list of them (which must have one per prompt)."""
    if isinstance(temperature, int | float):
        return [float(temperature)] * prompts
    if len(temperature) != prompts:
        raise InputError(f"bad sampling settings: {len(temperature)} temperatures for {prompts} prompts")
    return [float(t) for t in temperature]


class TokenizerPrompts:
    """encode_prompt and tokenize_response of a backend that holds a transformers tokenizer (`self.tokenizer`)."""

    tokenizer: Any

    def encode_prompt(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt)

    def tokenize_response(self, prompt: str, response: str, add_eos: bool = True) -> tuple[list[int], list[int]]:
        return tokenize_response(self.tokenizer, prompt, response, add_eos)


class TransformersPolicy(TokenizerPrompts):
    """Any causal LM that transformers loads, on CPU or one GPU; own sampling loop over the KV cache."""

    def __init__(self, model, tokenizer, model_id: str, batch_size: int = 64):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.source: str | None = None  # the directory or hub name it was loaded from, when it was
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        self.precision = ("transformers", str(next(model.parameters()).dtype).removeprefix("torch."))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError(f"tokenizer of {model_id} has neither a pad nor an eos token")

    @classmethod
    def from_pretrained(
        cls, path_or_name: str, device: str = "cpu", dtype: str | torch.dtype = "float32", batch_size: int = 64,
        model_id: str | None = None,
    ) -> TransformersPolicy:
        """Load a local directory or a hub name with AutoModelForCausalLM / AutoTokenizer; its model_id is
        `model_identity(path_or_name)` unless given (see spo_lake.models.identity)."""
        target = resolve_model(path_or_name)
        try:
            # never code or pickles from a model directory (docs/security.md)
            tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=False)
            model = AutoModelForCausalLM.from_pretrained(target, dtype=_resolve_dtype(dtype), use_safetensors=True,
                                                         trust_remote_code=False)
        except (OSError, ValueError) as exc:  # what transformers raises for a directory or name it cannot load
            raise InputError(f"cannot load model {path_or_name!r}: {str(exc).splitlines()[0]}") from None
        # transformers types its `to` wrapper as taking the model again: the stub, not the call, is wrong
        model = model.to(device)  # type: ignore[arg-type]
        policy = cls(model, tokenizer, model_id=model_id or model_identity(path_or_name),
                     batch_size=batch_size)
        policy.source = target  # where it was loaded from: what another process loads (model_id is an identity)
        return policy

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        # assign: the module takes the given tensors rather than copying into its own (no second copy of a version;
        # the caller must not modify them afterwards, as the trainer's published versions are never modified)
        self.model.load_state_dict(state_dict, assign=True)

    # ------------------------------------------------------------------------------------- sampling

    @torch.inference_mode()
    def sample(
        self,
        prompts: Sequence[str],
        n: int = 1,
        temperature: float | Sequence[float] = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        stop: Sequence[str] | None = None,
        seed: int = 0,
    ) -> list[SampleResult]:
        check_settings(n, temperature, top_p, max_new_tokens)
        temperatures = per_prompt(temperature, len(prompts))
        encoded = [self.encode_prompt(p) for p in prompts]
        jobs = [i for i in range(len(prompts)) for _ in range(n)]
        return self._decode(jobs, [encoded[i] for i in jobs], [temperatures[i] for i in jobs], top_p,
                            max_new_tokens, list(stop or []), seed)

    @torch.inference_mode()
    def sample_continuations(self, prefixes: Sequence[Sequence[int]], temperature: float = 1.0, top_p: float = 1.0,
                             max_new_tokens: int = 256, stop: Sequence[str] | None = None, seed: int = 0
                             ) -> list[SampleResult]:
        """See PolicyBackend. `batch_size` rows at a time, continuously refilled; request i draws from a stream
        seeded from (`seed`, i)."""
        check_settings(1, temperature, top_p, max_new_tokens)
        rows = range(len(prefixes))
        return self._decode(list(rows), [list(p) for p in prefixes], [temperature for _ in rows], top_p,
                            max_new_tokens, list(stop or []), seed)

    def _decode(self, prompt_indices: list[int], prompt_ids: list[list[int]], temperatures: list[float], top_p: float,
                max_new_tokens: int, stop: list[str], seed: int) -> list[SampleResult]:
        """Every request through the continuous-batching loop (spo_lake.models.decode), `batch_size` in flight.

        A hand-written loop rather than `model.generate`, which draws from torch's global RNG: that RNG is shared by
        every thread of the process (a rollout worker samples while the trainer steps), so samples would depend on
        thread timing. Here every request draws from its own stream seeded from (`seed`, its index), and both the
        sampled-from and the model's own log-probs of each token come out of the same step."""
        if not prompt_ids:
            return []
        responses = decode(self.model, self.tokenizer, self.pad_id, prompt_ids, temperatures, top_p, max_new_tokens,
                           stop, seed, self.batch_size)
        return [SampleResult(prompt_index=i, token_ids=r.token_ids, logprobs=r.logprobs, finish_reason=r.finish_reason,
                             text=self.tokenizer.decode(r.token_ids, skip_special_tokens=True),
                             policy_logprobs=r.policy_logprobs)
                for i, r in zip(prompt_indices, responses)]

    # ------------------------------------------------------------------------------------- scoring

    @torch.inference_mode()
    def score(
        self,
        prompt_ids: Sequence[Sequence[int]],
        response_ids: Sequence[Sequence[int]],
        batch_size: int = 16,
        padding_side: str = "left",
    ) -> list[list[float]]:
        """Per-token log-probs of each response given its prompt, by teacher forcing in padded batches.

        Position ids count real tokens only and padding is masked, so a sequence's log-probs do not depend
        on the other sequences in its batch nor on the padding side."""
        if len(prompt_ids) != len(response_ids):
            raise ValueError(f"score: {len(prompt_ids)} prompts but {len(response_ids)} responses")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("score: every prompt needs at least one token (e.g. BOS) to condition the response on")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', not {padding_side!r}")
        # Batches of similar lengths (less padding to compute), results back in the callers' order.
        order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]) + len(response_ids[i]))
        out: list[list[float]] = [[] for _ in order]
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            scores = self._score_batch([list(prompt_ids[i]) for i in chunk], [list(response_ids[i]) for i in chunk],
                                       padding_side)
            for i, score in zip(chunk, scores):
                out[i] = score
        return out

    def _score_batch(
        self, prompts: list[list[int]], responses: list[list[int]], padding_side: str
    ) -> list[list[float]]:
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
        width = max(lengths)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        offsets = [0 if padding_side == "right" else width - n for n in lengths]
        for row, (p, r) in enumerate(zip(prompts, responses)):
            input_ids[row, offsets[row] : offsets[row] + lengths[row]] = torch.tensor(p + r)
            attention_mask[row, offsets[row] : offsets[row] + lengths[row]] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        # Logits only from the first position that predicts a response token on (the LM head over the prompts'
        # positions would be wasted: a quarter of a 135M model's compute per position, the logits' memory)
        skip = min(offsets[row] + len(p) - 1 for row, p in enumerate(prompts))
        logits = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask),
            logits_to_keep=width - skip,
        ).logits
        scores = []
        for row, (p, r) in enumerate(zip(prompts, responses)):
            first = offsets[row] + len(p) - skip  # logits at t predict token t+1
            targets = input_ids[row, skip + first : skip + first + len(r)]
            scores.append(gather_token_log_probs(logits[row, first - 1 : first - 1 + len(r)], targets).tolist())
        return scores
