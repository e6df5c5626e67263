"""Canonical forms and hashes for dedup.

`normalize_python` / `code_hash` group programs that differ only in layout: Python's own tokenizer
drops comments, blank lines, line continuations and the spacing between tokens, and the canonical form
re-indents each logical line by its block depth (4 spaces a level), so consistent re-indentation does not
matter either. Identifiers, literals and string contents (docstrings included) do matter.

`normalize_text` / `response_hash` are the plain-text counterpart used at ingest for whole responses.
"""
from __future__ import annotations

import hashlib
import io
import tokenize

from spo_lake.tasks.extract import unify_newlines

# Token types that carry no meaning for identity. INDENT/DEDENT are tracked as block depth instead.
_LAYOUT = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER})

# Prefix of the fallback form. A tokenised form never starts with "#" (comments are dropped), so broken
# code can never share a hash with a program that tokenises.
UNTOKENIZABLE = "#untokenizable\n"


def normalize_python(code: str) -> str:
    """Canonical token form of `code`: one logical line per line, tokens separated by one space.

    Never raises. Code the tokenizer rejects (unterminated strings or brackets, inconsistent dedents,
    ...) falls back to a whitespace-collapsed form instead: `UNTOKENIZABLE` followed by the non-blank
    lines with every run of whitespace (indentation included) collapsed to one space.
    """
    try:
        return _token_form(code)
    except (tokenize.TokenError, SyntaxError):  # SyntaxError covers IndentationError
        return _whitespace_form(code)


def code_hash(code: str) -> str:
    """sha256 hex digest of `normalize_python(code)`."""
    return _sha256(normalize_python(code))


def normalize_text(text: str) -> str:
    """Plain-text canonical form of a response: LF line endings, no trailing whitespace on any line,
    no leading or trailing blank lines. The first line's indentation is kept: HumanEval completions
    are function bodies, where it is meaningful."""
    lines = [line.rstrip() for line in unify_newlines(text).split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def response_hash(text: str) -> str:
    """sha256 hex digest of `normalize_text(text)`."""
    return _sha256(normalize_text(text))


def _token_form(code: str) -> str:
    lines: list[str] = []
    current: list[str] = []
    depth = 0
    for token in tokenize.generate_tokens(io.StringIO(unify_newlines(code)).readline):
        if token.type == tokenize.INDENT:
            depth += 1
        elif token.type == tokenize.DEDENT:
            depth -= 1
        elif token.type == tokenize.NEWLINE:
            if current:
                lines.append("    " * depth + " ".join(current))
            current = []
        elif token.type not in _LAYOUT and token.string.strip():  # 3.11 emits whitespace ERRORTOKENs
            current.append(token.string)
    if current:
        lines.append("    " * depth + " ".join(current))
    return "\n".join(lines)


def _whitespace_form(code: str) -> str:
    lines = (" ".join(line.split()) for line in unify_newlines(code).split("\n"))
    return UNTOKENIZABLE + "\n".join(line for line in lines if line)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
