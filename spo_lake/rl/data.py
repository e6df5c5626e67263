"""Training data: lake trajectories streamed from a pinned snapshot, and the prompts of the online rollouts.

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
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from spo_lake.errors import InputError
from spo_lake.lake import Lake, Snapshot
from spo_lake.lake.sql import CANONICAL_SQL, DEDUP_METHOD, VERDICT_SQL, where_clause
from spo_lake.models.backend import PolicyBackend
from spo_lake.models.tokens import tokenizer_id, trajectory_token_ids
from spo_lake.rl.config import StreamConfig
from spo_lake.rl.examples import Example
from spo_lake.scores import q0_from_counts
from spo_lake.tasks import Problem

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


def solution_log_mass(lake: Lake, snapshot: str | Snapshot, pi0_id: str) -> dict[str, float]:
    """{prompt_id: log Σ_{y∈K} π0(y)} over K, the prompt's distinct correct responses (by text) whose π0 log-probs the
    lake caches: the mass losses.lake_bounded_q0 bounds V* with. Prompts without such a row are absent."""
    rows = lake.sql(f"""
        WITH verdicts AS ({VERDICT_SQL}),
        solutions AS (
            SELECT t.prompt_id, list_sum(lp.logprobs) AS logp FROM trajectories t JOIN verdicts v USING (trajectory_id)
            JOIN logprobs lp USING (trajectory_id)
            WHERE v.passed AND lp.model_id = $pi0 AND len(lp.logprobs) > 0
            QUALIFY row_number() OVER (PARTITION BY t.prompt_id, t.response_text ORDER BY t.trajectory_id) = 1)
        SELECT prompt_id, max(logp) + ln(sum(exp(logp - max_logp))) AS log_mass
        FROM (SELECT *, max(logp) OVER (PARTITION BY prompt_id) AS max_logp FROM solutions) GROUP BY prompt_id
        """, snapshot, params={"pi0": pi0_id}).to_pylist()
    return {r["prompt_id"]: min(float(r["log_mass"]), 0.0) for r in rows}
