from __future__ import annotations

import hashlib
import sys

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spo_lake.ingest.ids import BLANKS, response_digests, response_hashes, trajectory_ids
from spo_lake.tasks.normalize import response_hash

# Text built from the characters normalisation cares about, plus ordinary and multi-byte ones.
PIECES = st.sampled_from(["\n", "\r", "\r\n", " ", "\t", "\x0b", "\xa0", "\u3000", "\u2028", "\x85", "a", "é", "中",
                          "def f():", "    return 1", "\u00e9\n"])
TEXTS = st.lists(PIECES, max_size=12).map("".join)


def test_blanks_are_exactly_the_characters_rstrip_removes_besides_line_breaks():
    expected = {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()} - {"\n", "\r"}
    assert set(BLANKS) == expected


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=8), st.integers(1, 3))
def test_vectorised_hashes_equal_the_reference_functions(texts, n_chunks):
    step = -(-len(texts) // n_chunks)
    column = pa.chunked_array([pa.array(texts[i: i + step], pa.string()) for i in range(0, len(texts), step)])
    normalised, exact = response_digests(column)
    assert normalised.to_pylist() == [response_hash(t) for t in texts]
    assert exact.to_pylist() == [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert response_hashes(column).equals(normalised)


def batch(responses: list[str], **columns) -> pa.Table:
    n = len(responses)
    base = {"trajectory_id": pa.nulls(n, pa.string()), "prompt_id": ["p"] * n, "source": ["policy"] * n,
            "model": pa.nulls(n, pa.string()), "run_id": pa.nulls(n, pa.string()), "response": responses}
    return pa.table({**base, **columns})


def ids_of(t: pa.Table) -> list[str]:
    return trajectory_ids(t, response_digests(t.column("response"))[1]).to_pylist()


def test_ids_are_deterministic_and_repeats_stay_distinct():
    t = batch(["a", "b", "a", "a"])
    ids = ids_of(t)
    assert len(set(ids)) == 4
    assert ids == ids_of(t)
    assert ids[:2] == ids_of(batch(["a", "b"]))  # the first occurrence's id does not depend on later rows


def test_ids_depend_on_every_part_of_the_content():
    base = ids_of(batch(["x"]))[0]
    variants = [
        batch(["x "]),  # exact text, not the normalised one
        batch(["x"], prompt_id=["q"]),
        batch(["x"], source=["human"]),
        batch(["x"], model=["m"]),
        batch(["x"], run_id=["r"]),
        batch(["x"], model=[""]),  # empty is not absent
    ]
    ids = [ids_of(v)[0] for v in variants]
    assert base not in ids and len(set(ids)) == len(ids)
    # the fields are framed: moving a character from one field to the next changes the id
    assert ids_of(batch(["x"], model=["ab"], run_id=["c"])) != ids_of(batch(["x"], model=["a"], run_id=["bc"]))


def test_given_ids_are_kept():
    t = batch(["a", "a"], trajectory_id=pa.array(["mine", None]))
    ids = ids_of(t)
    assert ids[0] == "mine" and ids[1] == ids_of(batch(["a"]))[0]


def test_batches_and_chunks_line_up(monkeypatch):
    import spo_lake.ingest.ids as ids

    monkeypatch.setattr(ids, "BATCH_ROWS", 2)
    texts = ["a\n", "\n\nb", "c \nd", "e\r\n", "\n f ", "g", "h\u3000\n\n"]
    column = pa.chunked_array([pa.array(texts[:3]), pa.array(texts[3:4]), pa.array(texts[4:])])
    normalised, exact = response_digests(column)
    assert normalised.to_pylist() == [response_hash(t) for t in texts]
    assert exact.to_pylist() == [hashlib.sha256(t.encode()).hexdigest() for t in texts]
