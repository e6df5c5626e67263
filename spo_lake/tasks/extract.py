"""Pull the program out of a model response.

Chat and chain-of-thought models wrap code in prose and markdown fences, often drafting several blocks
before the final one. The rule, in order:

1. the last complete fenced block tagged as Python (```python, ```py, ```python3, ```py3, any case;
   ~~~ fences too)  -> method "fence:python"
2. else the last complete untagged block (``` or ~~~)  -> method "fence:bare"
3. else the whole response  -> method "whole"

A tagged block wins over a later bare one because a trailing bare block is usually sample output
("Output:\n```\n3\n```"). Blocks tagged with another language (```cpp, ```text) are never taken.
Fences follow CommonMark: an opening line of 3+ backticks or tildes plus an optional info string
(a backtick fence's info string may not contain a backtick, so ```x``` inline is no fence); the block
ends at a line holding only the same character, at least as many times. An unclosed fence (a truncated
generation) is not a complete block. A fence indented by n columns (e.g. inside a list item) has up to
n columns of indentation removed from its content lines. Line endings are unified to "\n" first.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Extracted:
    code: str
    method: str  # "fence:python" | "fence:bare" | "whole"


@dataclass(frozen=True)
class _Block:
    tag: str  # lower-cased first word of the info string; "" for an untagged fence
    code: str


def extract_code(response: str) -> Extracted:
    """The program in `response` (see the module docstring for the rule)."""
    text = unify_newlines(response)
    blocks = _complete_blocks(text)
    tagged = [b for b in blocks if b.tag in PYTHON_TAGS]
    if tagged:
        return Extracted(tagged[-1].code, "fence:python")
    bare = [b for b in blocks if b.tag == ""]
    if bare:
        return Extracted(bare[-1].code, "fence:bare")
    return Extracted(text, "whole")


def unify_newlines(text: str) -> str:
    """CRLF and lone CR become LF, as Python's universal newlines do."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _complete_blocks(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        if end is None:  # unclosed: nothing after it can be a complete block either
            break
        body = [_dedent(line, indent) for line in lines[i + 1 : end]]
        code = "\n".join(body) + "\n" if body else ""
        blocks.append(_Block(_tag(opening["info"]), code))
        i = end + 1
    return blocks


def _tag(info: str) -> str:
    """First word of the info string, lower-cased: "Python title=x" -> "python", "{python}" -> "python"."""
    words = info.strip().strip("{}").split()
    return re.split(r"[:,;]", words[0])[0].lower() if words else ""


def _dedent(line: str, indent: int) -> str:
    strip = 0
    while strip < indent and strip < len(line) and line[strip] in " \t":
        strip += 1
    return line[strip:]
