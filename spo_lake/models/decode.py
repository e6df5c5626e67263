"""The decoding loop of TransformersPolicy: continuous batching over a preallocated KV cache.

`decode` samples one response per request (a list of token ids to continue) with `slots` rows in flight. When a
row's response ends, its slot takes the next pending request at once: its prompt is prefilled alone and its keys
and values are written into that row of the cache, right-aligned to the current length, so a batch never waits for
its longest response while requests are pending. Once none are, finished rows are dropped from the batch.

The cache (`SlotLayer`) is preallocated: a step writes one column in place, where transformers' DynamicCache
concatenates the whole cache every step (at batch 64 and 200 positions, ~0.6 GB copied per step for a 135M model).
Columns no live row attends to any more are cut off when the buffer fills (`_reframe`).

Each request draws from a random stream of its own (seeded from the call's seed and its index: one uniform per token,
`draw_tokens`), so which slot it lands in and when does not change its draws: the same requests, settings, seed and
slot count give the same token ids, and a request's tokens do not depend on how long the others ran (up to the
float rounding that a different batch composition can bring).
"""
from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer

from spo_lake.models.sampling import draw_tokens, gather_token_log_probs, positions_from_mask
from spo_lake.tasks.extract import extract_code

# A stop "string" that is a rule: the response ends at the line that closes its first complete fenced code block
# (```python ... ```), where `extract_code` (what pyfunc and HumanEval judge) finds a block. A plain "```" would stop
# at the opening fence.
CLOSING_FENCE = "<closing code fence>"


class SlotLayer(DynamicLayer):
    """One layer's keys and values in buffers [rows, heads, capacity, head_dim], written in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        super().__init__()
        self.k_buffer, self.v_buffer = keys, values
        self.length = 0
        self.is_initialized = True
        self.device = keys.device

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + key_states.shape[-2]
        self.k_buffer[:, :, self.length:end] = key_states
        self.v_buffer[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.k_buffer[:, :, :end], self.v_buffer[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length


@dataclass
class Response:
    """What `decode` returns per request: the new tokens, their sampled-from and model log-probs, how it ended."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


@dataclass
class Settings:
    temperatures: list[float]  # one per request
    top_p: float
    max_new_tokens: int
    stop: list[str]
    eos: int | None


class Decoder:
    """One `decode` call's state. Rows of the batch are slots; `job[row]` is the request a slot holds (None: idle)."""

    def __init__(self, model, tokenizer, pad_id: int, requests: Sequence[list[int]], settings: Settings,
                 seed: int, slots: int):
        self.model, self.tokenizer, self.pad_id = model, tokenizer, pad_id
        self.requests, self.settings = requests, settings
        seeds = torch.randint(2**62, (len(requests),), generator=torch.Generator().manual_seed(seed)).tolist()
        self.streams = [random.Random(s) for s in seeds]
        self.device = next(model.parameters()).device
        self.out = [Response() for _ in requests]
        self.pending = deque(range(len(requests)))
        self.job: list[int | None] = []
        self.layers: list[SlotLayer] = []
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [rows, capacity] 0/1
        self.position = torch.zeros(0, dtype=torch.long, device=self.device)  # next position id per row
        self.last = torch.zeros(0, dtype=torch.long, device=self.device)  # last token per row
        self.slots = slots
        self.cache: Cache | None = None
        self.pieces: dict[int, str] = {}
        # a response ends within max_new_tokens, so one slot's prompt + response always fits in `room` columns
        self.room = max(len(r) for r in requests) + settings.max_new_tokens + 1
        self.same_temperature = len(set(settings.temperatures)) == 1
        self.untempered_is_sampled = settings.temperatures[0] == 1.0 and self.same_temperature and \
            settings.top_p >= 1.0

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def run(self) -> list[Response]:
        first = [self.pending.popleft() for _ in range(min(self.slots, len(self.pending)))]
        self.job = [None] * len(first)
        self._refill(self._admit(list(range(len(first))), first))
        while any(j is not None for j in self.job):
            if not self.pending and sum(j is not None for j in self.job) <= len(self.job) // 2:
                self._keep([row for row, j in enumerate(self.job) if j is not None])
            self._step()
        return self.out

    # ---------------------------------------------------------------------------------- the batch

    def _refill(self, ended: list[int]) -> None:
        """Give ended slots the next pending requests (whose first token may end them again)."""
        while ended and self.pending:
            jobs = [self.pending.popleft() for _ in ended[:len(self.pending)]]
            ended = self._admit(ended[:len(jobs)], jobs)

    def _admit(self, rows: list[int], jobs: list[int]) -> list[int]:
        """Prefill requests `jobs` alone, put them into idle slots `rows` and draw their first tokens; the rows that
        ended at once."""
        prompts = [self.requests[j] for j in jobs]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        fresh = DynamicCache(config=self.model.config)
        positions = positions_from_mask(mask)
        logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=fresh,
                            use_cache=True, logits_to_keep=1).logits[:, -1]
        kv: list[tuple[torch.Tensor, torch.Tensor]] = [(layer.keys, layer.values)  # type: ignore[union-attr,misc]
                                                       for layer in fresh.layers]
        if not self.layers:  # the first admission sizes the batch
            capacity = width + self.room
            self.layers = [SlotLayer(k.new_zeros(*k.shape[:2], capacity, k.shape[3]),
                                     v.new_zeros(*v.shape[:2], capacity, v.shape[3])) for k, v in kv]
            for slot in self.layers:
                slot.length = width
            self.mask = torch.zeros((len(rows), capacity), dtype=torch.long, device=self.device)
            self.position = torch.zeros(len(rows), dtype=torch.long, device=self.device)
            self.last = torch.zeros(len(rows), dtype=torch.long, device=self.device)
            self.cache = Cache(layers=self.layers)  # type: ignore[arg-type]  # (a list is invariant)
        elif self.length < width:  # the new prompt is longer than the cache so far: pad every row in front
            self._reframe(self.length - width)
        end = self.length
        index = torch.tensor(rows, device=self.device)
        for slot, (k, v) in zip(self.layers, kv):
            slot.k_buffer[index, :, end - width:end] = k
            slot.v_buffer[index, :, end - width:end] = v
        self.mask[index] = 0
        self.mask[index, end - width:end] = mask
        self.position[index] = positions[:, -1] + 1
        for row, j in zip(rows, jobs):
            self.job[row] = j
        return self._emit(rows, logits)

    def _step(self) -> None:
        """One token for every row (idle rows compute too: dropping them costs a copy of the cache)."""
        if self.length == self.mask.shape[1]:
            live = [row for row, j in enumerate(self.job) if j is not None]
            first_needed = int(self.mask[live, :self.length].argmax(-1).min())  # first column a live row attends to
            self._reframe(first_needed)
        self.mask[:, self.length] = 1
        logits = self.model(
            input_ids=self.last.unsqueeze(-1), attention_mask=self.mask[:, :self.length + 1],
            position_ids=self.position.unsqueeze(-1), past_key_values=self.cache, use_cache=True,
        ).logits[:, -1]
        self.position += 1
        live = [row for row, j in enumerate(self.job) if j is not None]
        self._refill(self._emit(live, logits[live] if len(live) < len(self.job) else logits))

    def _emit(self, rows: list[int], logits: torch.Tensor) -> list[int]:
        """Draw the next token of slots `rows` from their logits [len(rows), V] and record it; the rows it ended."""
        s = self.settings
        temperatures = [s.temperatures[self.job[row]] for row in rows]  # type: ignore[index]
        temperature: float | torch.Tensor = temperatures[0] if self.same_temperature else \
            torch.tensor(temperatures, device=self.device).unsqueeze(-1)
        uniform = torch.tensor([self.streams[self.job[row]].random() for row in rows],  # type: ignore[index]
                               dtype=torch.float32, device=self.device)
        tokens, chosen = draw_tokens(logits, temperature, s.top_p, uniform)
        untempered = chosen if self.untempered_is_sampled else gather_token_log_probs(logits, tokens)
        self.last[rows] = tokens
        ended = []
        for row, token, lp, plp in zip(rows, tokens.tolist(), chosen.tolist(), untempered.tolist()):
            job = self.job[row]
            assert job is not None
            out = self.out[job]
            out.token_ids.append(token)
            out.logprobs.append(lp)
            out.policy_logprobs.append(plp)
            if token == s.eos or (s.stop and self._hits_stop(out.token_ids)):
                out.finish_reason = "stop"
            elif len(out.token_ids) < s.max_new_tokens:
                continue
            self.job[row] = None
            ended.append(row)
        return ended

    def _hits_stop(self, token_ids: list[int]) -> bool:
        """Whether the newest token completes a stop string (or closes a fenced block: CLOSING_FENCE). Decoding is
        skipped for a token whose text cannot end one: it holds no stop string's last character (nor a partial
        UTF-8 character, which a later token completes)."""
        token = token_ids[-1]
        piece = self.pieces.get(token)
        if piece is None:
            piece = self.pieces[token] = self.tokenizer.decode([token])
        ends = {"`", "~"} if CLOSING_FENCE in self.settings.stop else set()
        ends |= {s[-1] for s in self.settings.stop if s != CLOSING_FENCE}
        if "\ufffd" not in piece and not any(c in piece for c in ends):
            return False
        return hits_stop(self.tokenizer, token_ids, self.settings.stop)

    # ---------------------------------------------------------------------------------- cache layout

    def _keep(self, rows: list[int]) -> None:
        """Drop every other row from the batch (once no request is pending, ended rows only cost compute)."""
        index = torch.tensor(rows, device=self.device)
        for layer in self.layers:
            layer.k_buffer, layer.v_buffer = layer.k_buffer[index], layer.v_buffer[index]
        self.mask, self.position, self.last = self.mask[index], self.position[index], self.last[index]
        self.job = [self.job[row] for row in rows]

    def _reframe(self, start: int) -> None:
        """Make column `start` the first (negative: add -start empty columns in front); room for `room` more."""
        length = self.length - start
        capacity = length + self.room
        src, dst = slice(max(start, 0), self.length), slice(max(-start, 0), length)
        for layer in self.layers:
            for name in ("k_buffer", "v_buffer"):
                old = getattr(layer, name)
                new = old.new_zeros(*old.shape[:2], capacity, old.shape[3])
                new[:, :, dst] = old[:, :, src]
                setattr(layer, name, new)
            layer.length = length
        mask = self.mask.new_zeros(self.mask.shape[0], capacity)
        mask[:, dst] = self.mask[:, src]
        self.mask = mask


def hits_stop(tokenizer, token_ids: list[int], stop: Sequence[str]) -> bool:
    """Whether the text of `token_ids` ends in a stop string its last token completed, or (CLOSING_FENCE) holds a
    complete fenced code block."""
    strings = [s for s in stop if s != CLOSING_FENCE]
    if strings:
        # Only the tail can hold a stop string that the newest token completed.
        tail = tokenizer.decode(token_ids[-max(len(s) for s in strings) - 1:], skip_special_tokens=True)
        if any(s in tail for s in strings):
            return True
    return CLOSING_FENCE in stop and \
        extract_code(tokenizer.decode(token_ids, skip_special_tokens=True)).method != "whole"


def fence_end(tokenizer, token_ids: list[int]) -> int | None:
    """How many of `token_ids` a CLOSING_FENCE stop keeps (up to the token that closes the first complete fenced
    block), None if no block closes: for a backend that cannot stop at the rule itself and cuts afterwards (what it
    keeps is what stopping would have sampled)."""
    for k, token in enumerate(token_ids, 1):
        if any(c in tokenizer.decode([token]) for c in "`~\ufffd") and hits_stop(tokenizer, token_ids[:k],
                                                                                  [CLOSING_FENCE]):
            return k
    return None


def decode(model, tokenizer, pad_id: int, requests: Sequence[list[int]], temperatures: list[float], top_p: float,
           max_new_tokens: int, stop: list[str], seed: int, slots: int) -> list[Response]:
    """One sampled response per request (token ids to continue), `slots` at a time; see the module docstring."""
    settings = Settings(temperatures, top_p, max_new_tokens, stop, tokenizer.eos_token_id)
    return Decoder(model, tokenizer, pad_id, requests, settings, seed, slots).run()

