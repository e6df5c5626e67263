"""Content-derived trajectory ids and normalised response hashes, over whole Arrow columns.

`response_hash` is sha256 of `spo_lake.tasks.normalize.normalize_text(response)`; the content id of a trajectory
hashes (prompt_id, source, model, run_id, sha256 of the exact response). Both digests come from ONE pass over each
response's bytes, read straight from the Arrow buffers: for most responses the normalised text is the raw text minus
blanks at its ends, so sha256 runs over that middle, is copied for the response hash, then fed the trimmed tail for
the raw hash. Responses with CR line ends or blanks ending an inner line go through `normalize_text` itself.
"""
from __future__ import annotations

import binascii
import hashlib
from collections import Counter
from typing import cast

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from spo_lake.tasks.normalize import normalize_text

# The characters str.isspace() accepts, minus the line breaks "\n" and "\r" (str.rstrip strips exactly these).
BLANKS = ("\t\x0b\x0c\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009"
          "\u200a\u2028\u2029\u202f\u205f\u3000")
BATCH_ROWS = 65_536
_NEEDS_LINES = "\r|[" + "".join(f"\\x{{{ord(c):x}}}" for c in BLANKS) + "]\n"  # RE2: CR, or a blank ending a line


def _lengths(col: pa.ChunkedArray) -> list[int]:
    return pc.binary_length(col).to_numpy(zero_copy_only=False).tolist()


def _slices(chunk: pa.Array) -> tuple[memoryview, list[int]]:
    """The data buffer of a string array and its value offsets."""
    width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
    offsets = np.frombuffer(chunk.buffers()[1], dtype=width)[chunk.offset: chunk.offset + len(chunk) + 1]
    data = chunk.buffers()[2]
    return memoryview(data if data is not None else b""), offsets.tolist()


def _value(col: pa.ChunkedArray, row: int) -> memoryview:
    """The UTF-8 bytes of one string of a chunked column."""
    for chunk in col.chunks:
        if row < len(chunk):
            view, offsets = _slices(chunk.slice(row, 1))
            return view[offsets[0]: offsets[1]]
        row -= len(chunk)
    raise IndexError(row)


def _hex(digests: list[bytes]) -> pa.Array:
    """Equal-length binary digests as a column of hex strings, converted in one call rather than row by row."""
    data = binascii.hexlify(b"".join(digests))
    width = 2 * len(digests[0]) if digests else 0
    offsets = np.arange(0, len(data) + 1, width or 1, dtype=np.int32)
    return pa.StringArray.from_buffers(len(digests), pa.py_buffer(offsets), pa.py_buffer(data))


def response_digests(responses: pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """(sha256 of each normalised response, sha256 of each exact response) as hex; `responses` has no nulls."""
    responses = responses.cast(pa.string())
    normalised: list[bytes] = []
    exact: list[bytes] = []
    for start in range(0, len(responses), BATCH_ROWS):  # batches keep the trimmed copies small
        _digest_batch(responses.slice(start, BATCH_ROWS), normalised, exact)
    return _hex(normalised), _hex(exact)


def _digest_batch(responses: pa.ChunkedArray, normalised: list[bytes], exact: list[bytes]) -> None:
    trimmed_end = pc.utf8_rtrim(responses, characters=BLANKS + "\n")
    trimmed = pc.utf8_ltrim(trimmed_end, characters="\n")
    middles = _lengths(trimmed)
    row0 = len(normalised)
    sha256 = hashlib.sha256
    for chunk in responses.chunks:
        view, offsets = _slices(chunk)
        done = len(normalised) - row0
        for start, end, middle in zip(offsets, offsets[1:], middles[done: done + len(chunk)]):
            h = sha256(view[start: start + middle])  # the hot loop: one pass over each response
            normalised.append(h.digest())
            h.update(view[start + middle: end])
            exact.append(h.digest())
    # Redo the rows the loop got wrong: leading newlines (the middle does not start at 0) ...
    leads = np.subtract(_lengths(trimmed_end), middles)
    for row in np.flatnonzero(leads).tolist():
        text = _value(responses, row)
        normalised[row0 + row] = sha256(text[leads[row]: leads[row] + middles[row]]).digest()
        exact[row0 + row] = sha256(text).digest()
    # ... and CR line ends or blanks ending an inner line, which only `normalize_text` itself gets right.
    needs_lines = pc.match_substring_regex(responses, _NEEDS_LINES).to_numpy(zero_copy_only=False)
    for row in np.flatnonzero(needs_lines).tolist():
        text = _value(responses, row)
        normalised[row0 + row] = sha256(normalize_text(bytes(text).decode("utf-8")).encode()).digest()
        exact[row0 + row] = sha256(text).digest()


def response_hashes(responses: pa.ChunkedArray) -> pa.Array:
    """sha256 hex of each normalised response: equal to `response_hash(r)` for every r."""
    return response_digests(responses)[0]


def _self_delimiting(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """'<byte length>:<value>' or '-' for null, so a concatenation of such fields splits back one way only."""
    col = col.cast(pa.string())
    framed = pc.binary_join_element_wise(pc.cast(pc.binary_length(col), pa.string()), col, ":")
    return pc.if_else(pc.is_valid(col), framed, "-")


def _md5_hex(strings: pa.ChunkedArray) -> pa.ChunkedArray:
    """md5 hex of each string, by DuckDB on all cores (input order kept). The strings are short keys ending in a
    sha256, so md5's weakness to chosen collisions does not reach the response text."""
    con = duckdb.connect()
    try:
        con.register("keys", pa.table({"k": strings}))
        return con.sql("SELECT md5(k) FROM keys").to_arrow_table().column(0)
    finally:
        con.close()


# What makes a sample a separate draw, when the input records it: the policy that drew it, its sampling settings,
# and its metadata (a sampler's seed or sample index). Part of the id only for rows that carry any of them.
DRAW_FIELDS = ("policy_version", "temperature", "top_p", "metadata")


class SeenIds:
    """How often each id occurred in the earlier batches of a streamed input, in 8 bytes a distinct id (a sorted
    array of 64-bit prefixes; ids seen more than once also count in a dict). A prefix collision (about n^2 / 2^65)
    only renumbers a row's id, deterministically, so a re-ingest still derives the same ids."""

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.uint64)
        self.more: dict[int, int] = {}  # key -> occurrences beyond the first

    @staticmethod
    def prefixes(ids: list[str], hashed: bool = True) -> np.ndarray:
        """64-bit prefixes of md5 hex ids (`hashed`), or of the md5 of any other strings (ids a user gave)."""
        hexes = ids if hashed else [hashlib.md5(i.encode()).hexdigest() for i in ids]
        return np.frombuffer(binascii.unhexlify("".join(h[:16] for h in hexes)), dtype=">u8").astype(np.uint64)

    def earlier(self, keys: np.ndarray) -> np.ndarray:
        """Occurrences of each key in the batches added so far."""
        if not len(self.keys):
            return np.zeros(len(keys), dtype=np.int64)
        found = self.keys[np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)] == keys
        counts = found.astype(np.int64)
        for i in np.flatnonzero(found).tolist():
            counts[i] += self.more.get(int(keys[i]), 0)
        return counts

    def add(self, keys: np.ndarray) -> None:
        unique, counts = np.unique(keys, return_counts=True)
        for k, c, known in zip(unique.tolist(), counts.tolist(), (self.earlier(unique) > 0).tolist()):
            extra = c if known else c - 1
            if extra:
                self.more[k] = self.more.get(k, 0) + extra
        self.keys = np.union1d(self.keys, unique)


def trajectory_ids(t: pa.Table, exact_hashes: pa.Array, seen: SeenIds | None = None) -> pa.Array:
    """Ids for the rows of a validated trajectory batch: the given `trajectory_id`, else content-derived.

    The content id is md5 of (prompt_id, source, model, run_id, sha256 of the exact response), plus DRAW_FIELDS
    when a row has any: the same response drawn in two batches with another seed, policy version or temperature is
    another fact. The k-th repeat (k >= 1) of the same content within one input gets md5(first id + "#k"):
    identical samples stay distinct rows, and re-ingesting the same input derives the same ids again.
    """
    given = t.column("trajectory_id").combine_chunks()
    if given.null_count == 0:
        return given
    fields = [_self_delimiting(t.column(c)) for c in ("prompt_id", "source", "model", "run_id")]
    draws = [t.column(c) for c in DRAW_FIELDS if c in t.column_names]
    if draws:
        has_draw = pc.is_valid(draws[0])
        for c in draws[1:]:
            has_draw = pc.or_(has_draw, pc.is_valid(c))
        framed = pc.binary_join_element_wise(*[_self_delimiting(c) for c in draws], "")
        fields.append(pc.if_else(has_draw, pc.binary_join_element_wise("draw:", framed, ""), ""))
    key = pc.binary_join_element_wise(*fields, exact_hashes, "")
    derived = _md5_hex(key)
    missing = pc.is_null(given)
    content = derived.filter(missing).to_pylist()
    keys = SeenIds.prefixes(content) if seen is not None and content else None
    earlier = seen.earlier(keys) if seen is not None and keys is not None else np.zeros(len(content), dtype=np.int64)
    if earlier.any() or pc.count_distinct(derived.filter(missing)).as_py() < len(content):  # repeats: number them
        ids, has_given = derived.to_pylist(), pc.is_valid(given).to_pylist()
        before = iter(earlier.tolist())
        numbered: Counter[str] = Counter()
        for row, first in enumerate(ids):
            if has_given[row]:
                continue
            k = next(before) + numbered[first]  # earlier occurrences: in previous batches, then in this one
            numbered[first] += 1
            if k:
                ids[row] = hashlib.md5(f"{first}#{k}".encode()).hexdigest()
        derived = pa.array(ids, pa.string())
    if seen is not None and keys is not None:
        seen.add(keys)
    return pc.if_else(pc.is_valid(given), given, derived)


def adopt_unattributed(existing: pl.LazyFrame, t: pa.Table, ids: pa.Array, hashes: pa.Array,
                       taken: set[str] | None = None) -> pa.Array:
    """Rows that name neither a model nor a trajectory_id take the id of a lake trajectory with the same prompt,
    source, run and exact response, whatever its model (the k-th such row the k-th such trajectory by id).

    So a file ingested once with --model and again without it is recognised ("0 new, N already present") instead
    of landing twice. `existing` is the trajectories table; `hashes` the normalised response hashes of `t`;
    `taken` the ids earlier batches of the same input adopted (updated here), so each is adopted once.
    """
    loose = pc.and_(pc.is_null(t.column("model")), pc.is_null(t.column("trajectory_id")))
    if not pc.any(loose).as_py():
        return ids
    keys = ["prompt_id", "source", "run_id", "response_hash"]
    # (casts: pyarrow has no type information, so polars' from_arrow cannot tell a Table from an Array)
    rows = (cast(pl.DataFrame, pl.from_arrow(t.select(["prompt_id", "source", "run_id", "response"])))
            .rename({"response": "response_text"})
            .with_columns(response_hash=cast(pl.Series, pl.from_arrow(hashes)), row=pl.int_range(pl.len()))
            .filter(pl.from_arrow(loose.combine_chunks() if isinstance(loose, pa.ChunkedArray) else loose)))
    found = (existing.filter(pl.col("model_id").is_not_null())
             .select("trajectory_id", *keys, "response_text")
             .join(rows.lazy().select(keys).unique(), on=keys, how="semi", nulls_equal=True)
             .collect())
    if taken:
        found = found.filter(~pl.col("trajectory_id").is_in(pl.Series(sorted(taken), dtype=pl.String).implode()))
    if found.is_empty():
        return ids
    same = [*keys, "response_text"]
    rank = pl.int_range(pl.len()).over(same)
    matched = (rows.sort("row").with_columns(k=rank)
               .join(found.sort("trajectory_id").with_columns(k=rank), on=[*same, "k"], nulls_equal=True))
    out = ids.to_pylist()
    for row, tid in matched.select("row", "trajectory_id").iter_rows():
        out[row] = tid
        if taken is not None:
            taken.add(tid)
    return pa.array(out, pa.string())
