"""Code extraction from chat / chain-of-thought responses."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spo_lake.tasks.extract import Extracted, extract_code, unify_newlines

COT = """Let me think about this.

A first attempt:

```python
def f(x):
    return x  # draft
```

That is wrong for negative x. Trying it:

```
>>> f(-1)
-1
```

Final answer:

```python
def f(x):
    return abs(x)
```

Sample output:
```
1
```
"""


def test_cot_takes_last_python_block_over_later_bare_output_block():
    assert extract_code(COT) == Extracted("def f(x):\n    return abs(x)\n", "fence:python")


@pytest.mark.parametrize("tag", ["python", "py", "python3", "py3", "Python", "PYTHON3", "python title=sol.py",
                                 "python:solution.py", "{python}"])
def test_python_tags(tag):
    assert extract_code(f"Here:\n```{tag}\nprint(1)\n```\n") == Extracted("print(1)\n", "fence:python")


def test_bare_block_when_no_tagged_block_and_last_bare_wins():
    response = "a\n```\nprint(1)\n```\nb\n```\nprint(2)\n```\nbye"
    assert extract_code(response) == Extracted("print(2)\n", "fence:bare")


def test_other_languages_are_never_taken():
    response = "```cpp\nint main(){}\n```\n```text\nout\n```"
    assert extract_code(response) == Extracted(response, "whole")


def test_no_fence_gives_whole_response():
    response = "n = int(input())\nprint(n * 2)\n"
    assert extract_code(response) == Extracted(response, "whole")


def test_unclosed_last_fence_is_not_complete_so_earlier_block_wins():
    response = "```python\nprint('done')\n```\nNow improved:\n```python\nprint('trunc"
    assert extract_code(response) == Extracted("print('done')\n", "fence:python")


def test_only_unclosed_fence_gives_whole():
    response = "Sure!\n```python\nprint(1)\n"
    assert extract_code(response) == Extracted(response, "whole")


def test_tilde_fences_and_mixing_characters():
    # a ``` line inside a ~~~ block does not close it
    response = "~~~python\ns = '''\n```\n'''\nprint(s)\n~~~\n"
    assert extract_code(response) == Extracted("s = '''\n```\n'''\nprint(s)\n", "fence:python")


def test_backticks_inside_code_do_not_close_the_fence():
    code = 'fence = "```"\nprint(fence + "python")\nprint("``` not a closer")\n'
    assert extract_code(f"Code:\n```python\n{code}```\n").code == code


def test_longer_fence_needs_as_long_a_closer():
    code = "doc = '''\n```\n'''\n"
    assert extract_code(f"````python\n{code}````\n") == Extracted(code, "fence:python")


def test_inline_triple_backticks_are_not_a_fence():
    response = "Wrap code like ```python``` then\n```python\nx = 1\n```"
    assert extract_code(response) == Extracted("x = 1\n", "fence:python")


def test_crlf_and_cr_line_endings():
    response = "Answer:\r\n```python\r\nprint(1)\r\nprint(2)\r\n```\r\n"
    assert extract_code(response) == Extracted("print(1)\nprint(2)\n", "fence:python")
    assert extract_code("x = 1\r\ny = 2\r").code == "x = 1\ny = 2\n"


def test_indented_fence_in_list_item_is_dedented_by_its_indentation():
    response = "1. Solve:\n   ```python\n   def f():\n       return 1\n   ```\n"
    assert extract_code(response).code == "def f():\n    return 1\n"


def test_closing_fence_may_carry_trailing_spaces_but_no_text():
    response = "```python\nx = 1\n``` trailing text\ny = 2\n```   \n"
    assert extract_code(response).code == "x = 1\n``` trailing text\ny = 2\n"


def test_empty_block():
    assert extract_code("```python\n```") == Extracted("", "fence:python")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["```", "~~~", "````", "python", "py", "cpp", "\n", "\r\n", " ", "x = 1", "`"]),
                max_size=30).map("".join))
def test_any_text_extracts_to_a_part_of_itself(response):
    extracted = extract_code(response)
    text = unify_newlines(response)
    assert extracted.method in ("fence:python", "fence:bare", "whole")
    if extracted.method == "whole":
        assert extracted.code == text
    else:
        assert all(line.strip() in text for line in extracted.code.splitlines())
