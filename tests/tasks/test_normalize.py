"""Normalisation for dedup: layout never matters, names and strings always do."""
from __future__ import annotations

import keyword
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from spo_lake.tasks.normalize import (
    UNTOKENIZABLE,
    code_hash,
    normalize_python,
    normalize_text,
    response_hash,
)

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(lambda s: not keyword.iskeyword(s))
ATOMS = st.one_of(NAMES, st.integers(0, 999).map(str),
                  st.text("ABC XYZ#", max_size=6).map(repr))  # "#" in a string is no comment; upper case: no name
EXPRS = st.one_of(ATOMS, st.builds("{} + {}".format, ATOMS, ATOMS), st.builds("len({})".format, ATOMS))
COMMENTS = st.text(st.characters(blacklist_categories=["Cc", "Cs"]), max_size=12).map(lambda s: "# " + s)


@st.composite
def programs(draw, depth=0):
    """A valid program as (indent level, line) pairs."""
    lines: list[tuple[int, str]] = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["assign", "call"] + (["if", "def", "for"] if depth < 2 else [])))
        if kind == "assign":
            lines.append((depth, f"{draw(NAMES)} = {draw(EXPRS)}"))
        elif kind == "call":
            lines.append((depth, f"print({draw(EXPRS)})"))
        else:
            header = {"if": f"if {draw(EXPRS)}:", "def": f"def {draw(NAMES)}({draw(NAMES)}):",
                      "for": f"for {draw(NAMES)} in range(3):"}[kind]
            lines.append((depth, header))
            lines.extend(draw(programs(depth + 1)))
    return lines


def render(lines, indent="    "):
    return "".join(indent * level + text + "\n" for level, text in lines)


@st.composite
def relayouts(draw, lines):
    """The same program with another indent unit, comments, blank lines and spacing around operators."""
    indent = draw(st.sampled_from(["  ", "    ", "\t", "        "]))
    out = []
    for level, text in lines:
        for _ in range(draw(st.integers(0, 2))):
            out.append(draw(st.sampled_from(["", "   ", "\t", indent * draw(st.integers(0, 3)) + draw(COMMENTS)])))
        if draw(st.booleans()):
            text = text.replace(" = ", "=", 1).replace(" + ", "  +  ", 1)
        if draw(st.booleans()):
            text += "  " + draw(COMMENTS)
        out.append(indent * level + text)
    return "\n".join(out) + draw(st.sampled_from(["", "\n", "\n\n  \n", "\r\n"]))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_layout_comments_and_indentation_do_not_change_the_hash(data):
    lines = data.draw(programs())
    original = render(lines)
    variant = data.draw(relayouts(lines))
    compile(variant, "<variant>", "exec")  # the variant is the same valid program, not a broken one
    assert code_hash(variant) == code_hash(original)
    assert not normalize_python(original).startswith(UNTOKENIZABLE)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_renaming_an_identifier_changes_the_hash(data):
    original = render(data.draw(programs()))
    names = sorted(set(re.findall(r"\b[a-z][a-z0-9_]*\b", original)) - set(keyword.kwlist))
    old = data.draw(st.sampled_from(names))  # every statement holds a name (print at least)
    renamed = re.sub(rf"\b{old}\b", old + "_2", original)  # string literals are upper case: names only
    compile(renamed, "<renamed>", "exec")
    assert code_hash(renamed) != code_hash(original)


def test_renaming_a_name_and_changing_a_string_change_the_hash():
    base = "def f(x):\n    return x + 'a b'\n"
    assert code_hash(base) != code_hash("def f(y):\n    return y + 'a b'\n")
    assert code_hash(base) != code_hash("def f(x):\n    return x + 'a  b'\n")
    assert code_hash(base) != code_hash("def f(x):\n    return x + 'a b' + 0\n")


def test_canonical_form_is_readable_and_drops_continuations_and_docstring_layout_stays():
    code = 'import os  # why\n\n\ndef f(a,\n      b):\n    """Doc  string."""\n    return a+\\\n        b\n'
    assert normalize_python(code) == 'import os\ndef f ( a , b ) :\n    """Doc  string."""\n    return a + b'


def test_block_structure_matters():
    inside = "if x:\n    y = 1\n    z = 2\n"
    outside = "if x:\n    y = 1\nz = 2\n"
    assert code_hash(inside) != code_hash(outside)


BROKEN_PIECES = [*"ab(){}[]'\"\\#:=+ \t\n\r\x00é", "def ", "if 1:\n", "'''", "    "]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(BROKEN_PIECES), max_size=40).map("".join))
def test_never_raises_on_broken_code(code):
    assert isinstance(normalize_python(code), str)
    assert re.fullmatch(r"[0-9a-f]{64}", code_hash(code))


def test_untokenizable_code_falls_back_to_collapsed_whitespace():
    broken = "def f(:\n    return  [1,\n"
    assert normalize_python(broken) == UNTOKENIZABLE + "def f(:\nreturn [1,"
    assert code_hash(broken) == code_hash("def   f(:\n\n\treturn [1,   \n")
    assert code_hash(broken) != code_hash("def f(:\n    return [2,\n")


def test_normalize_text():
    assert normalize_text("\n\n  body\r\nline  \t\r\n\n\n") == "  body\nline"
    assert response_hash("a\r\nb  \n") == response_hash("a\nb\n")
    assert response_hash("    return x") != response_hash("return x")  # a body's indentation is meaningful
    assert response_hash("a b") != response_hash("a  b")
