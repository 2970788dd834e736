"""The sandboxed side of the code judge (rlkit/sandbox/code_judge.py), part 1 of 3: the wire format.

Stdlib only, no rlkit imports: the three parts (this, _judge_serve.py, _judge_run.py) are joined into one
program that runs as `python -I -c <program> serve|test` inside the sandbox (code_judge.py passes it compiled);
a line ending in `# child: joined` imports between parts for linters and readers and is dropped when joined.

Two processes per judged program, which never share an interpreter:

* `serve` loads the program under test and answers requests on its objects (call a function, read an
  attribute, iterate...) with plain data; values it cannot send as data stay here behind a handle.
  It never sees a test.
* `test` runs the tests. A name the program defines is bound to a proxy whose every use is a request to
  `serve`, relayed by the judge; the replies are decoded here into plain values (int, str, list, ...,
  never an object of the program's making), so `==`, `assert` and the verdict are computed by code the
  program cannot reach. Comparing or truth-testing a proxy (a program-made object, e.g. one with its own
  `__eq__`) is refused: error kind `opaque_value`.

Framing, one line per message (json payloads never hold a raw newline); both children first say `UP`
(the interpreter runs: time limits start now):
  judge -> serve: `S <json {src}>` once, then `Q <id> <json request>`
  serve -> judge: `READY <json {kind}>` once (the program loaded, or why not), then `R <id> <json reply>`
  judge -> test:  `T <json {i, src}>` run test i | `N` a new program (drop every proxy) |
                  `R <id> <json reply>` (serve's answer, passed on verbatim) | `F <id> <kind>` (the call failed)
  test -> judge:  `Q <id> <json request>` | `V <json {i, kind}>` (the verdict of test i)
The judge's pipes are moved off fds 0/1 first; stdout (print) then goes to stderr, stdin reads /dev/null.
"""

from __future__ import annotations

import builtins
import collections
import importlib
import json
import operator
import os
import sys
import types

_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
_EXCEPTIONS = {n: c for n, c in vars(builtins).items() if isinstance(c, type) and issubclass(c, BaseException)}
_BINOPS = {n: getattr(operator, n) for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and_", "or_", "xor", "lshift", "rshift",
)}
_UNOPS = {"neg": operator.neg, "pos": operator.pos, "abs": operator.abs, "invert": operator.invert,
          "int": int, "float": float, "index": operator.index, "len": len, "str": str, "repr": repr}
_FAIL_KINDS = frozenset({"timeout", "memory", "exited", "output_limit", "protocol_error", "runtime_error"})
_INLINE_GLOBAL_BYTES = 1 << 16  # bigger plain globals stay behind a handle
_MUTABLE = (list, dict, set, bytearray, collections.deque)  # arguments a call may change in place


class ProtocolError(Exception):
    pass


# ---------------------------------------------------------------------------------------------- channel


def _channel() -> tuple:
    cin, cout = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return os.fdopen(cin, "rb"), cout


def _send(fd: int, line: str) -> None:
    data = (line + "\n").encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(fd, data):]


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------- plain data


def encode(x, ref, depth: int = 0):
    """`x` as tagged json; anything that is not plain data goes through `ref` (a handle or an error)."""
    if depth > 400:
        raise RecursionError("value nested too deep to send")
    d = depth + 1
    if x is None or x is True or x is False:
        return x
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str.__str__(x)
    if isinstance(x, list):
        return [encode(v, ref, d) for v in x]
    if isinstance(x, tuple):
        fields = getattr(type(x), "_fields", None)
        if type(fields) is tuple and len(fields) == len(x) and all(type(f) is str for f in fields):
            return {"t": "namedtuple", "name": type(x).__name__, "fields": list(fields),
                    "v": [encode(v, ref, d) for v in x]}
        return {"t": "tuple", "v": [encode(v, ref, d) for v in x]}
    if isinstance(x, collections.deque):
        return {"t": "deque", "v": [encode(v, ref, d) for v in x]}
    if isinstance(x, dict):
        return {"t": "dict", "v": [[encode(k, ref, d), encode(v, ref, d)] for k, v in x.items()]}
    if isinstance(x, (set, frozenset)):
        return {"t": "frozenset" if isinstance(x, frozenset) else "set", "v": [encode(v, ref, d) for v in x]}
    if isinstance(x, (bytes, bytearray)):
        return {"t": type(x).__name__ if type(x) in (bytes, bytearray) else "bytes", "v": bytes(x).hex()}
    if isinstance(x, complex):
        return {"t": "complex", "v": [x.real, x.imag]}
    if isinstance(x, range):
        return {"t": "range", "v": [x.start, x.stop, x.step]}
    module = type(x).__module__
    if module == "fractions" and isinstance(x, sys.modules["fractions"].Fraction):
        return {"t": "fraction", "v": [int(x.numerator), int(x.denominator)]}
    if module == "decimal" and isinstance(x, sys.modules["decimal"].Decimal):
        return {"t": "decimal", "v": str(x)}
    if module == "numpy" and getattr(x, "shape", None) == () and hasattr(x, "item"):
        return encode(x.item(), ref, d)  # numpy scalars compare like the Python number they hold
    return ref(x)


def decode(v, deref):
    """Tagged json -> plain values; `deref` turns the tags `ref`, `exc`, `module`, `import` into objects."""
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v) is list:
        return [decode(x, deref) for x in v]
    if type(v) is not dict or type(v.get("t")) is not str:
        raise ProtocolError("malformed value")
    tag, body = v["t"], v.get("v")
    if tag in ("tuple", "set", "frozenset", "deque"):
        items = [decode(x, deref) for x in _list(body)]
        return {"tuple": tuple, "set": set, "frozenset": frozenset, "deque": collections.deque}[tag](items)
    if tag == "namedtuple":  # a local class of the same name and fields (compares like a tuple)
        fields = tuple(_str(f) for f in _list(v.get("fields")))
        key = (_str(v.get("name")), fields)
        if key not in _NAMEDTUPLES:
            _NAMEDTUPLES[key] = collections.namedtuple(key[0], fields)
        return _NAMEDTUPLES[key](*(decode(x, deref) for x in _list(body)))
    if tag == "dict":
        return {decode(k, deref): decode(x, deref) for k, x in (_pair(p) for p in _list(body))}
    if tag in ("bytes", "bytearray"):
        return (bytes if tag == "bytes" else bytearray).fromhex(_str(body))
    if tag == "complex":
        re_, im = _list(body)
        return complex(float(re_), float(im))
    if tag == "range":
        return range(*(int(n) for n in _list(body)))
    if tag == "fraction":
        num, den = _list(body)
        return importlib.import_module("fractions").Fraction(int(num), int(den))
    if tag == "decimal":
        return importlib.import_module("decimal").Decimal(_str(body))
    return deref(v)


_NAMEDTUPLES: dict[tuple, type] = {}


def _list(x) -> list:
    if type(x) is not list:
        raise ProtocolError("malformed value")
    return x


def _pair(x) -> tuple:
    if type(x) is not list or len(x) != 2:
        raise ProtocolError("malformed value")
    return x[0], x[1]


def _str(x) -> str:
    if type(x) is not str:
        raise ProtocolError("malformed value")
    return x


def _stdlib_module(name: str):
    """A standard-library module by name; never a file from the scratch dir or site-packages."""
    if type(name) is not str or name.split(".")[0] not in _STDLIB:
        raise ProtocolError(f"not a standard-library module: {name!r}")
    return importlib.import_module(name)


def _importable(x) -> dict | None:
    """A stdlib module, or a class/function that a stdlib module exposes under its own name."""
    if type(x).__name__ == "module" and getattr(x, "__name__", None) in sys.modules:
        name = x.__name__
        return {"t": "module", "v": name} if name.split(".")[0] in _STDLIB else None
    mod, qual = getattr(x, "__module__", None), getattr(x, "__qualname__", None)
    if type(mod) is not str or type(qual) is not str or mod.split(".")[0] not in _STDLIB or "<" in qual:
        return None
    try:
        obj = sys.modules[mod]
        for part in qual.split("."):
            obj = getattr(obj, part)
    except (KeyError, AttributeError):
        return None
    return {"t": "import", "mod": mod, "v": qual} if obj is x else None


def _plain_exception_class(x) -> bool:
    """An exception class with the default equality and metaclass: safe to re-create in the tester."""
    return isinstance(x, type) and type(x) is type and issubclass(x, BaseException) and x.__eq__ is object.__eq__


def _import(tag: dict):
    """The stdlib object a tag names; only a class, function or module (never an instance such as
    unittest.mock.ANY, which equals everything)."""
    obj = _stdlib_module(tag.get("mod"))
    for part in _str(tag.get("v")).split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type) and type(obj).__eq__ is type.__eq__:
        return obj
    if type(obj) in (types.FunctionType, types.BuiltinFunctionType, types.ModuleType):
        return obj
    raise ProtocolError("an import tag names something that is not a class or function")
