"""Values as data between the host and an untrusted program: JSON lines with a few tags, decoded defensively.

Standard library only: the sandbox harness runs this same file (it is prepended to harness.py), so both sides
speak one encoding. Scalars (None, bool, int, float, str) are JSON scalars and lists JSON arrays; the other
containers are one-key objects: {"t": [...]} tuple, {"s": [...]} set, {"f": [...]} frozenset, {"d": [[k, v], ...]}
dict, {"b": "latin-1 text"} bytes. Only these exact types travel: a subclass (an int whose __eq__ is always
true, say) or any other object is `Unserialisable`, so nothing the program defines ever runs on the host.

`read_message` is what the host applies to everything a program writes: a size cap, valid UTF-8, a depth and
node cap, a JSON object. Whatever comes in, it returns a value or raises `BadData`, never anything else. The node
cap is checked on the raw bytes before anything is parsed, and scales with the size cap, so that the memory a
message costs the host stays a small multiple of that cap (issue 28: a 16 MiB line of empty lists cost 318-436 MB
when the whole line was parsed first).
"""
import json
import re

MAX_DEPTH = 64
MAX_NODES = 1 << 20
_SCALARS = (type(None), bool, int, float, str)
_TAGGED = {tuple: "t", set: "s", frozenset: "f"}
BYTES_PER_NODE = 16  # a message may hold one value (container, item, key) per this many bytes of its size cap
OBJECT_NODES = 4  # a JSON object counts as this many values: parsed and decoded, it is the costliest (a set)
# a JSON string, or an unterminated one up to the end: once a quote opens, the match always succeeds, so a line
# with many quotes costs linear time
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)


class Unserialisable(TypeError):
    """The value (or something inside it) is not one of the types that travel as data."""


class BadData(ValueError):
    """What arrived is not a well-formed message: too big, not UTF-8, too deep, not JSON, the wrong shape."""


def encode(value, depth=0):
    """`value` as plain JSON data (see the module docstring); exact types only, no method of `value` is called."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise Unserialisable("nested too deeply")
    if kind in _SCALARS:
        return value
    if kind is list:
        return [encode(item, depth + 1) for item in value]
    if kind in _TAGGED:
        return {_TAGGED[kind]: [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"b": value.decode("latin-1")}
    raise Unserialisable(f"a {kind.__name__} object cannot leave the sandbox")


def decode(data):
    """The value `encode` made; raises BadData for anything else (including unhashable set members or keys)."""
    budget = [MAX_NODES]

    def walk(item, depth):
        budget[0] -= 1
        if depth > MAX_DEPTH or budget[0] < 0:
            raise BadData("value nested too deeply or too large")
        if type(item) in _SCALARS:
            return item
        if type(item) is list:
            return [walk(x, depth + 1) for x in item]
        if type(item) is not dict or len(item) != 1:
            raise BadData("malformed value")
        (tag, body), = item.items()
        if tag == "b" and type(body) is str:
            try:
                return body.encode("latin-1")
            except UnicodeEncodeError:
                raise BadData("malformed bytes") from None
        if type(body) is not list:
            raise BadData("malformed value")
        items = [walk(x, depth + 1) for x in body]
        try:
            if tag == "t":
                return tuple(items)
            if tag == "s":
                return set(items)
            if tag == "f":
                return frozenset(items)
            if tag == "d" and all(type(pair) is list and len(pair) == 2 for pair in items):
                return dict(items)
        except TypeError:  # an unhashable member or key
            raise BadData("unhashable set member or dict key") from None
        raise BadData("malformed value")

    return walk(data, 0)


def message_line(message):
    """One message as a line of bytes (json never writes a raw newline)."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()


def read_message(line, max_bytes):
    """The JSON object in `line` (bytes, without its newline), checked as described in the module docstring."""
    if len(line) > max_bytes:
        raise BadData(f"message longer than {max_bytes} bytes")
    if _too_many_values(line, max(MAX_NODES >> 10, min(MAX_NODES, max_bytes // BYTES_PER_NODE))):
        raise BadData("message holds too many values")
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # ValueError: also ints past 4300 digits
        raise BadData(f"unreadable message ({type(error).__name__})") from None
    if type(message) is not dict:
        raise BadData("message is not a JSON object")
    return message




def _too_many_values(line, limit):
    """Whether the JSON text `line` (bytes) holds more than `limit` values (objects weighing OBJECT_NODES),
    decided without parsing it: every container opens with a bracket and every further item or key follows a comma
    or a colon, outside strings. C-speed counts decide most lines; strings are cut out (about a microsecond each)
    only when there are few."""
    if _structure(line) < limit:  # counted inside strings too: an upper bound
        return False
    if (line.count(b'"') - line.count(b'\\"')) // 2 > limit:  # at least this many strings, each a value
        return True
    return _structure(_JSON_STRING.sub(b"", line)) >= limit


def _structure(text):
    return OBJECT_NODES * text.count(b"{") + sum(text.count(char) for char in (b"[", b",", b":"))
