"""Training data: lake trajectories streamed from a pinned snapshot, padded batches, and the stream mixer.

How a lake stream stays memory-flat: keyset pagination over a deterministic hash order. Every epoch orders the
stream's selection by md5(trajectory_id | seed | epoch | stream) and fetches one page at a time with
`WHERE (key, id) > (last key, last id) ORDER BY key, id LIMIT page`: DuckDB keeps only a top-`page` heap, reads
only the key columns for the ordering, and the full rows (text, token ids, cached log-probs, Monte-Carlo targets)
only for the page's ids. Memory is O(page) whatever the lake's size, the shuffle is an exact permutation (not the
approximation a bounded shuffle buffer gives), and the resume state is three values (epoch, key, id). The price is
one ordering scan of the key columns per page, which is small next to the training compute a page feeds.

Same snapshot + same seed ⇒ the same sequence of rows; nothing depends on file layout or thread timing.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import torch

from spo_lake.errors import InputError
from spo_lake.lake import Lake, Snapshot
from spo_lake.lake.sql import CANONICAL_SQL, DEDUP_METHOD, VERDICT_SQL, where_clause
from spo_lake.models.backend import PolicyBackend
from spo_lake.models.tokens import tokenizer_id, trajectory_token_ids
from spo_lake.rl.config import StreamConfig
from spo_lake.scores import q0_from_counts
from spo_lake.tasks import Problem

if TYPE_CHECKING:
    from spo_lake.rl.rollout import OnlineSource

# Prompt-level Q0 counts and prefix estimates are of π0 ($pi0) itself: temperature 1, top-p 1 (what `spolake q0`/`pts`
# write).
PI0_SAMPLES = "model_id = $pi0 AND temperature = 1.0 AND top_p = 1.0"

SELECTION_SQL = """
WITH verdicts AS ({verdicts}),
q0 AS (
    SELECT prompt_id, n AS q0_n, n_success AS q0_success FROM "values"
    WHERE trajectory_id IS NULL AND position IS NULL AND {pi0_samples}
    QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY n DESC, created_at DESC) = 1),
mc AS (  -- searched non-terminal positions (PTS also records S(T) = 1 at the end: that is the terminal objective's)
    SELECT v.trajectory_id, count(DISTINCT v.position) AS n_mc
    FROM (SELECT * FROM "values" WHERE {pi0_samples}) v JOIN trajectories tt USING (trajectory_id)
    WHERE v.position > 0 AND v.position < coalesce(len(tt.token_ids), 2147483647) GROUP BY v.trajectory_id),
pv AS (SELECT trajectory_id, count(*) AS n_pivots FROM pivots WHERE model_id = $pi0 GROUP BY trajectory_id),
lp AS (SELECT DISTINCT trajectory_id FROM logprobs WHERE model_id = $pi0),
dup AS (
    SELECT d.trajectory_id FROM duplicates d JOIN ({canonical}) c USING (prompt_id, code_hash)
    WHERE d.method = '{dedup_method}' AND d.trajectory_id <> c.canonical_trajectory_id)
SELECT t.*, p.task, v.reward, v.passed, v.verdict, q.q0_n, q.q0_success, coalesce(mc.n_mc, 0) AS n_mc,
       coalesce(pv.n_pivots, 0) AS n_pivots, lp.trajectory_id IS NOT NULL AS has_ref_logprobs,
       dup.trajectory_id IS NOT NULL AS duplicate
FROM trajectories t JOIN prompts p USING (prompt_id) JOIN verdicts v USING (trajectory_id)
LEFT JOIN q0 q USING (prompt_id) LEFT JOIN mc USING (trajectory_id) LEFT JOIN pv USING (trajectory_id)
LEFT JOIN lp USING (trajectory_id) LEFT JOIN dup USING (trajectory_id)
"""
# What a stream's `where` may name, besides every column of `trajectories`. `duplicate`: another trajectory of
# the prompt has the same normalised program and is the group's canonical row (`spolake dedup`).
SELECTION_COLUMNS = ("task", "reward", "passed", "verdict", "q0_n", "q0_success", "n_mc", "n_pivots",
                     "has_ref_logprobs", "duplicate")


@dataclass
class Example:
    """One training sequence, whatever its source."""

    stream: int  # index of the stream it came from
    prompt_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    q0: float  # Q̂0 of the prompt at the run's β; nan when the prompt has no Q0 counts (PPO needs none)
    ref_logprobs: list[float] | None = None  # cached log π0 of response_ids; None = score with the live π0
    behavior_logprobs: list[float] | None = None  # log-probs of the distribution the response was sampled from
    # log π_old: the sampling policy's own log-probs (no temperature, no top-p), PPO's ratio and KL reward
    policy_logprobs: list[float] | None = None
    policy_version: int = -1  # behaviour-policy version of an online rollout; -1 for lake data
    group: int = -1  # GRPO: the step's online group (one prompt's samples, and lake rows injected into it)
    mc_positions: list[int] = field(default_factory=list)  # Monte-Carlo targets: after the first p tokens ...
    mc_success: list[float] = field(default_factory=list)  # ... π0 succeeds with this probability
    trajectory_id: str | None = None


@dataclass
class Batch:
    """Padded tensors of a list of examples. Prompts are left-padded and responses right-padded, so every
    response starts at column P: the logits of the last T+1 positions score all responses at once.

    input_ids, attention_mask: (B, P+T). response_ids: (B, T); response_mask: (B, T) bool, left-aligned.
    ref_logprobs, behavior_logprobs, policy_logprobs: (B, T), valid where ref_cached / has_behavior /
    has_policy (B,) is set.
    reward, q0: (B,). mc_positions, mc_success, mc_mask: (B, M). stream, policy_version: (B,) long.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    ref_logprobs: torch.Tensor
    ref_cached: torch.Tensor
    behavior_logprobs: torch.Tensor
    has_behavior: torch.Tensor
    policy_logprobs: torch.Tensor
    has_policy: torch.Tensor
    reward: torch.Tensor
    q0: torch.Tensor
    mc_positions: torch.Tensor
    mc_success: torch.Tensor
    mc_mask: torch.Tensor
    stream: torch.Tensor
    policy_version: torch.Tensor

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{name: value.to(device) for name, value in vars(self).items()})

    def rows(self, index: torch.Tensor) -> Batch:
        """The sub-batch of the given rows (same padding)."""
        return Batch(**{name: value[index] for name, value in vars(self).items()})

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def _padded(rows: Sequence[Sequence[float] | None], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Pad a list of examples into a Batch (pure: no model, no lake)."""
    if not examples:
        raise ValueError("collate: no examples")
    prompt_width = max(len(e.prompt_ids) for e in examples)
    width = max(max(len(e.response_ids) for e in examples), 1)
    input_ids = torch.full((len(examples), prompt_width + width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, e in enumerate(examples):
        start = prompt_width - len(e.prompt_ids)
        ids = e.prompt_ids + e.response_ids
        input_ids[i, start : start + len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, start : start + len(ids)] = 1
    lengths = torch.tensor([len(e.response_ids) for e in examples])
    mc_width = max(1, max(len(e.mc_positions) for e in examples))
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_ids=_padded([e.response_ids for e in examples], width, pad_id, torch.long),
        response_mask=torch.arange(width)[None, :] < lengths[:, None],
        ref_logprobs=_padded([e.ref_logprobs for e in examples], width, 0.0, torch.float32),
        ref_cached=torch.tensor([e.ref_logprobs is not None for e in examples]),
        behavior_logprobs=_padded([e.behavior_logprobs for e in examples], width, 0.0, torch.float32),
        has_behavior=torch.tensor([e.behavior_logprobs is not None for e in examples]),
        policy_logprobs=_padded([e.policy_logprobs for e in examples], width, 0.0, torch.float32),
        has_policy=torch.tensor([e.policy_logprobs is not None for e in examples]),
        reward=torch.tensor([e.reward for e in examples], dtype=torch.float32),
        q0=torch.tensor([e.q0 for e in examples], dtype=torch.float32),
        mc_positions=_padded([e.mc_positions for e in examples], mc_width, 0, torch.long),
        mc_success=_padded([e.mc_success for e in examples], mc_width, 1.0, torch.float32),
        mc_mask=torch.arange(mc_width)[None, :] < torch.tensor([len(e.mc_positions) for e in examples])[:, None],
        stream=torch.tensor([e.stream for e in examples], dtype=torch.long),
        policy_version=torch.tensor([e.policy_version for e in examples], dtype=torch.long),
    )


def q0_or_nan(n: int | None, n_success: int | None, beta: float, prior: float = 0.0) -> float:
    return math.nan if n is None else q0_from_counts(n, n_success, beta, prior)


# ---------------------------------------------------------------------------------------------- lake streams


@dataclass(frozen=True)
class StreamSettings:
    """What a lake stream needs from the run's config."""

    pi0_id: str
    beta: float
    seed: int
    max_response_tokens: int
    require_q0: bool = True
    page_size: int = 1024
    q0_prior: float = 0.0


def selection_sql() -> str:
    """Every trajectory with a verdict and what streams select on (SELECTION_COLUMNS), for the π0 whose model_id is
    the parameter $pi0."""
    return SELECTION_SQL.format(pi0_samples=PI0_SAMPLES, canonical=CANONICAL_SQL, verdicts=VERDICT_SQL,
                                dedup_method=DEDUP_METHOD)


def stream_condition(stream: StreamConfig, require_q0: bool) -> str:
    """The rows of the selection a lake stream draws from: its `where`, Q0 counts for SPO, MC estimates for `mc`."""
    conditions = [f"({stream.where})" if stream.where else "TRUE"]
    conditions += ["q0_n IS NOT NULL"] if require_q0 else []
    conditions += ["n_mc > 0"] if stream.mc else []
    return " AND ".join(conditions)


def shuffle_salt(seed: int, epoch: int, stream: str) -> str:
    """Each epoch of a lake stream is its rows ordered by md5(trajectory_id || salt), then trajectory_id."""
    return f"|{seed}|{epoch}|{stream}"


class LakeStream:
    """An endless, deterministically shuffled stream of one stream's selection at a pinned snapshot."""

    def __init__(self, lake: Lake, snapshot: str | Snapshot, stream: StreamConfig, index: int,
                 settings: StreamSettings, model: PolicyBackend):
        self.stream, self.index, self.settings, self.model = stream, index, settings, model
        self.tok_id = tokenizer_id(model)
        self.con = lake.connect(snapshot)
        # The stream's rows, as a subquery (a view could not take the π0 id as a parameter).
        self.rows_sql = f"SELECT * FROM ({selection_sql()}) WHERE {stream_condition(stream, settings.require_q0)}"
        try:
            self.size = self._sql(f"SELECT count(*) AS n FROM ({self.rows_sql})").column("n")[0].as_py()
        except duckdb.Error as exc:  # duckdb's errors name the bad column; one line is enough
            reason = str(exc).splitlines()[0]
            raise InputError(f"stream {stream.name!r}: bad `where` ({stream.where}): {reason}") from None
        if self.size == 0:
            need = " with Q0 counts of π0 (run `spolake q0`)" if settings.require_q0 else ""
            need += " and Monte-Carlo prefix estimates (run `spolake pts`)" if stream.mc else ""
            raise InputError(f"stream {stream.name!r}: no trajectory matches `{stream.where or 'TRUE'}`{need} "
                             f"at the pinned snapshot")
        self.epoch, self.after = 0, ("", "")  # resume state: the last consumed row's (shuffle key, trajectory_id)
        self.skipped = 0
        self.ref_recomputed = 0  # cached π0 rows of another backend/precision, scored live instead
        self._page: deque[tuple[tuple[str, str], Example | None]] = deque()

    # ---- resume state
    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "after": list(self.after), "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.after, self.skipped = state["epoch"], tuple(state["after"]), state["skipped"]
        self._page = deque()

    # ---- reading
    def take(self, n: int) -> list[Example]:
        out: list[Example] = []
        while len(out) < n:
            if not self._page:
                self._page = self._fetch_page()
                if not self._page:  # epoch exhausted: a fresh permutation
                    self.epoch, self.after = self.epoch + 1, ("", "")
                    continue
            self.after, example = self._page.popleft()
            if example is None:
                self.skipped += 1
            else:
                out.append(example)
        return out

    def _sql(self, query: str, **params: Any) -> pa.Table:
        """`query` on the pinned snapshot, with $pi0 bound to π0's model_id."""
        return self.con.sql(query, params={"pi0": self.settings.pi0_id, **params}).to_arrow_table()

    def _fetch_page(self) -> deque[tuple[tuple[str, str], Example | None]]:
        keys = self._sql(f"""
            SELECT trajectory_id, shuffle_key, reward, q0_n, q0_success FROM (
                SELECT trajectory_id, md5(trajectory_id || $salt) AS shuffle_key, reward, q0_n, q0_success
                FROM ({self.rows_sql}))
            WHERE (shuffle_key, trajectory_id) > ($after_key, $after_id)
            ORDER BY shuffle_key, trajectory_id LIMIT {self.settings.page_size}""",
            salt=shuffle_salt(self.settings.seed, self.epoch, self.stream.name), after_key=self.after[0],
            after_id=self.after[1])
        return deque(self._examples(keys))

    def take_for(self, step: int, prompt_ids: Sequence[str], k: int) -> dict[str, list[Example]]:
        """Up to k rows of each prompt (GRPO injection): the first k of the prompt's rows in a hash order drawn
        afresh each step, so a step's choice depends on (seed, step) alone and a resumed run repeats it."""
        self.con.register("wanted", pa.table({"prompt_id": sorted(set(prompt_ids))}))
        keys = self._sql(f"""
            SELECT trajectory_id, shuffle_key, reward, q0_n, q0_success FROM (
                SELECT trajectory_id, prompt_id, md5(trajectory_id || $salt) AS shuffle_key, reward, q0_n, q0_success
                FROM ({self.rows_sql}) WHERE prompt_id IN (SELECT prompt_id FROM wanted))
            QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY shuffle_key, trajectory_id) <= {int(k)}
            ORDER BY shuffle_key, trajectory_id""", salt=shuffle_salt(self.settings.seed, step, self.stream.name))
        self.con.unregister("wanted")
        out: dict[str, list[Example]] = {}
        for _, example in self._examples(keys):
            if example is None:
                self.skipped += 1
            else:
                out.setdefault(example.prompt_id, []).append(example)
        return out

    def _examples(self, keys: pa.Table) -> list[tuple[tuple[str, str], Example | None]]:
        """The rows of `keys` (trajectory_id, shuffle_key, reward, q0_n, q0_success) as examples, in its order."""
        if keys.num_rows == 0:
            return []
        self.con.register("page_ids", keys.select(["trajectory_id"]))
        rows = _by_id(self.con.sql("""
            SELECT t.trajectory_id, t.token_ids, t.tokenizer_id, t.response_text, p.*
            FROM trajectories t JOIN prompts p USING (prompt_id) WHERE t.trajectory_id IN (SELECT * FROM page_ids)
            QUALIFY row_number() OVER (PARTITION BY t.trajectory_id ORDER BY t.created_at) = 1""").to_arrow_table())
        cached = _by_id(self._sql("""
            SELECT trajectory_id, tokenizer_id, token_ids, logprobs, backend, dtype FROM logprobs
            WHERE model_id = $pi0 AND trajectory_id IN (SELECT * FROM page_ids)
            QUALIFY row_number() OVER (PARTITION BY trajectory_id ORDER BY created_at DESC) = 1"""))
        mc = _by_id(self._sql(f"""
            SELECT trajectory_id, list(position ORDER BY position) AS positions,
                   list(n_success / n ORDER BY position) AS success FROM (
                SELECT * FROM "values" WHERE {PI0_SAMPLES} AND position IS NOT NULL
                  AND trajectory_id IN (SELECT * FROM page_ids)
                QUALIFY row_number() OVER (PARTITION BY trajectory_id, position ORDER BY n DESC, created_at DESC) = 1)
            GROUP BY trajectory_id""")) if self.stream.mc else {}
        self.con.unregister("page_ids")
        return [((key["shuffle_key"], key["trajectory_id"]),
                 self._example(key, rows[key["trajectory_id"]], cached.get(key["trajectory_id"]),
                               mc.get(key["trajectory_id"])))
                for key in keys.to_pylist()]

    def _example(self, key: dict, row: dict, cached: dict | None, mc: dict | None) -> Example | None:
        """The row as an Example, or None when it cannot be trained on (too long, MC targets out of range)."""
        prompt_ids, response_ids, _ = trajectory_token_ids(self.model, self.tok_id, row)
        if not response_ids or len(response_ids) > self.settings.max_response_tokens:
            return None
        ref = None
        if cached and cached["tokenizer_id"] == self.tok_id and list(cached["token_ids"]) == response_ids:
            # Log-probs of another precision differ by ~1e-2 nats/token: A_t would not start at 0 for lake rows.
            if (cached["backend"], cached["dtype"]) == tuple(self.model.precision):
                ref = list(cached["logprobs"])
            else:
                self.ref_recomputed += 1
        positions, success = (list(mc["positions"]), list(mc["success"])) if mc else ([], [])
        if any(not 0 <= p <= len(response_ids) for p in positions):
            return None
        # Monte-Carlo targets at searched non-terminal positions only (§3.1.3): Q_0 = Q̂0 has no gradient, and a
        # target at T would add a second copy of the terminal objective L(Q_T, r).
        kept = [i for i, p in enumerate(positions) if 0 < p < len(response_ids)]
        positions, success = [positions[i] for i in kept], [success[i] for i in kept]
        return Example(
            stream=self.index, prompt_id=row["prompt_id"], prompt_ids=prompt_ids, response_ids=response_ids,
            reward=key["reward"],
            q0=q0_or_nan(key["q0_n"], key["q0_success"], self.settings.beta, self.settings.q0_prior),
            ref_logprobs=ref, mc_positions=positions, mc_success=success, trajectory_id=row["trajectory_id"],
        )

    def close(self) -> None:
        self.con.close()


def _by_id(table: pa.Table) -> dict[str, dict[str, Any]]:
    return {r["trajectory_id"]: r for r in table.to_pylist()}


# ---------------------------------------------------------------------------------------------- prompts


def online_prompts(lake: Lake, snapshot: str | Snapshot, where: str, pi0_id: str, require_q0: bool
                   ) -> list[tuple[str, int | None, int | None]]:
    """(prompt_id, q0_n, q0_success) of every prompt for online rollouts, ordered by prompt_id."""
    join = "JOIN" if require_q0 else "LEFT JOIN"
    try:
        rows = lake.sql(f"""
            SELECT p.prompt_id, q.n AS q0_n, q.n_success AS q0_success FROM prompts p {join} (
                SELECT prompt_id, n, n_success FROM "values"
                WHERE trajectory_id IS NULL AND position IS NULL AND {PI0_SAMPLES}
                QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY n DESC, created_at DESC) = 1
            ) q USING (prompt_id) {where_clause(where)} ORDER BY p.prompt_id""", snapshot,
            params={"pi0": pi0_id}).to_pylist()
    except duckdb.Error as exc:
        raise InputError(f"prompts_where ({where}): {str(exc).splitlines()[0]}") from None
    if not rows:
        need = " that has Q0 counts of π0 (run `spolake q0`)" if require_q0 else ""
        raise InputError(f"no prompt matches prompts_where `{where or 'TRUE'}`{need} at the pinned snapshot")
    return [(r["prompt_id"], r["q0_n"], r["q0_success"]) for r in rows]


def fetch_problems(con, prompt_ids: Sequence[str]) -> dict[str, Problem]:
    """Problems by id through an open snapshot connection (`Lake.connect`)."""
    con.register("wanted", pa.table({"prompt_id": list(prompt_ids)}))
    rows = con.sql("SELECT * FROM prompts WHERE prompt_id IN (SELECT prompt_id FROM wanted) "
                   "QUALIFY row_number() OVER (PARTITION BY prompt_id ORDER BY created_at) = 1").to_arrow_table()
    con.unregister("wanted")
    return {r["prompt_id"]: Problem.from_row(r) for r in rows.to_pylist()}


# ---------------------------------------------------------------------------------------------- the mixer


class Mixer:
    """Draws every batch as fixed per-stream counts (fraction × batch size, spo_lake.rl.config.stream_counts),
    in stream order. Lake streams give their next rows; the online source (spo_lake.rl.rollout.OnlineSource, set
    when its worker starts) gives the rollouts scheduled for the step. Rank `rank` of `ranks` training processes
    reads every lake stream's next `ranks` × count rows and keeps its contiguous share of them. Streams in `joined`
    (GRPO `inject` streams) come with the online source's rollouts, joined to their groups."""

    def __init__(self, lake_streams: dict[int, LakeStream], counts: list[int], online_index: int | None,
                 rank: int = 0, ranks: int = 1, joined: Sequence[int] = ()):
        self.lake_streams, self.counts, self.online_index = lake_streams, counts, online_index
        self.joined = set(joined)
        self.rank, self.ranks = rank, ranks
        self.online_source: OnlineSource | None = None  # set when the trainer starts its rollout worker

    def draw(self, step: int) -> list[Example]:
        batch: list[Example] = []
        for index, count in enumerate(self.counts):
            if index == self.online_index:
                assert self.online_source is not None, "the online stream is drawn before its worker started"
                batch += self.online_source.take(step, count)
            elif index not in self.joined:
                batch += self.lake_streams[index].take(count * self.ranks)[self.rank * count : (self.rank + 1) * count]
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {str(i): s.state_dict() for i, s in self.lake_streams.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for i, s in self.lake_streams.items():
            s.load_state_dict(state[str(i)])
