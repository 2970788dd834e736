"""The sandboxed side of the code judge (rlkit/reward/judge.py). Stdlib only, no rlkit imports:
it runs as `python -I -c <this source> serve|test` inside the sandbox (judge.py passes it compiled).

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

import ast
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


# ---------------------------------------------------------------------------------------------- serve


class _Server:
    """Holds the program's namespace and every object handed out by handle."""

    def __init__(self, out_fd: int) -> None:
        self.out_fd = out_fd
        self.objects: list = []
        self.ids: dict[int, int] = {}
        self.ns: dict = {"__name__": "solution", "__builtins__": builtins}

    def ref(self, x) -> dict:
        tag = _importable(x) if _plain_exception_class(x) else None  # e.g. ValueError: the tester's own class
        if tag is not None:
            return tag
        key = id(x)  # anything else, even a stdlib function or module, stays here behind a handle
        if key not in self.ids:
            self.ids[key] = len(self.objects)
            self.objects.append(x)
        hid = self.ids[key]
        if isinstance(x, type) and issubclass(x, BaseException):
            base = next(c.__name__ for c in x.__mro__ if c.__name__ in _EXCEPTIONS and c in _EXCEPTIONS.values())
            return {"t": "exc", "id": hid, "name": str(x.__name__), "base": base}
        return {"t": "ref", "id": hid}

    def deref(self, tag: dict):
        kind = tag["t"]
        if kind in ("ref", "exc"):
            hid = tag.get("id")
            if type(hid) is not int or not 0 <= hid < len(self.objects):
                raise ProtocolError("unknown handle")
            return self.objects[hid]
        if kind == "module":
            return _stdlib_module(tag.get("v"))
        if kind == "import":
            return _import(tag)
        raise ProtocolError(f"unknown tag {kind!r}")

    def enc(self, x):
        return encode(x, self.ref)

    def dec(self, v):
        return decode(v, self.deref)

    def load(self, src: str) -> str:
        try:
            code = compile(src, "solution.py", "exec")
        except (SyntaxError, ValueError):
            return "syntax_error"
        try:
            exec(code, self.ns)
        except SystemExit:
            return "exited"
        except MemoryError:
            return "memory"
        except BaseException:
            return "runtime_error"
        return "ok"

    def answer(self, req: dict):
        op = req.get("op")
        if op == "names":
            found = {}
            for name in _list(req.get("v")):
                if type(name) is str and not name.startswith("__") and name in self.ns:
                    found[name] = self._global(self.ns[name])
            return {"t": "dict", "v": [[k, v] for k, v in found.items()]}
        args = [self.dec(a) for a in _list(req.get("a", []))]
        if op == "next":  # up to n items of an iterator, and whether it is exhausted
            it, n = args[0], int(req.get("n", 1))
            items = []
            for _ in range(max(1, min(n, 4096))):
                try:
                    items.append(next(it))
                except StopIteration:
                    return {"t": "tuple", "v": [self.enc(items), True]}
            return {"t": "tuple", "v": [self.enc(items), False]}
        if op == "call":  # also sends back the arguments the call changed (in-place mutation, e.g. xs.sort())
            raw_kw = [_pair(p) for p in _list(req.get("k", []))]
            kwargs = {_str(k): self.dec(v) for k, v in raw_kw}
            value = self.enc(args[0](*args[1:], **kwargs))
            sent = [(i, v, args[i]) for i, v in enumerate(req["a"]) if i] + [(k, v, kwargs[k]) for k, v in raw_kw]
            changed = [[key, now] for key, before, obj in sent
                       if type(obj) in _MUTABLE and (now := self.enc(obj)) != before]
            return {"t": "tuple", "v": [value, changed]}
        if op == "iter":
            return self.ref(iter(args[0]))  # always a handle: items are fetched with "next"
        if op in _SERVE_OPS:
            return self.enc(_SERVE_OPS[op](*args))
        if op in _BINOPS:
            return self.enc(_BINOPS[op](*args))
        if op in _UNOPS:
            return self.enc(_UNOPS[op](*args))
        raise ProtocolError(f"unknown request {op!r}")

    def _global(self, x):
        try:
            value = self.enc(x)
            if len(_dumps(value)) <= _INLINE_GLOBAL_BYTES:
                return value
        except RecursionError:
            pass
        return self.ref(x)

    def reply(self, rid: str, req: dict) -> None:
        try:
            body = {"v": self.answer(req)}
        except ProtocolError:
            os._exit(5)  # the request was malformed: the judge sees this process end
        except BaseException as exc:  # the program raised: the test sees the same exception type
            body = {"raise": self._exception(exc)}
        try:
            line = _dumps(body)
        except (RecursionError, ValueError, TypeError):
            line = _dumps({"raise": self._exception(RecursionError("value nested too deep to send"))})
        _send(self.out_fd, f"R {rid} {line}")

    def _exception(self, exc: BaseException) -> dict:
        try:
            args = self.enc(list(exc.args))
            _dumps(args)
        except BaseException:
            args = []
        return {"cls": self.ref(type(exc)), "args": args}


def serve() -> None:
    cin, cout = _channel()
    _send(cout, "UP")
    server = _Server(cout)
    first = cin.readline().decode("utf-8", "surrogatepass")
    if not first.startswith("S "):
        return
    kind = server.load(json.loads(first[2:])["src"])
    _send(cout, "READY " + _dumps({"kind": kind}))
    if kind != "ok":
        return
    for raw in cin:
        line = raw.decode("utf-8", "surrogatepass").rstrip("\n")
        tag, rid, payload = (line.split(" ", 2) + ["", ""])[:3]
        if tag != "Q":
            return
        server.reply(rid, json.loads(payload))


def _serve_setattr(obj, name, value):
    setattr(obj, name, value)


_SERVE_OPS = {
    "getattr": getattr,
    "setattr": _serve_setattr,
    "delattr": delattr,
    "getitem": operator.getitem,
    "setitem": operator.setitem,
    "delitem": operator.delitem,
    "contains": operator.contains,
}


# ---------------------------------------------------------------------------------------------- test


class JudgeFailure(BaseException):
    """A failure the test must not be able to swallow (`except Exception` does not catch it)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(detail or kind)
        self.kind = kind


class _Client:
    """The test side: requests to the program (through the judge) and the proxies they produce."""

    def __init__(self, cin, out_fd: int) -> None:
        self.cin, self.out_fd = cin, out_fd
        self.next_id = 0
        self.reset()

    def reset(self) -> None:
        self.proxies: dict[int, Remote] = {}
        self.exc_classes: dict[int, type] = {}
        self.buffers: dict[int, collections.deque] = {}
        self.failure: str | None = None

    def fail(self, kind: str, detail: str = "") -> JudgeFailure:
        self.failure = self.failure or kind
        return JudgeFailure(kind, detail)

    # -- values

    def ref(self, x) -> dict:
        if isinstance(x, Remote):
            return {"t": "ref", "id": object.__getattribute__(x, "_rid")}
        for hid, cls in self.exc_classes.items():
            if cls is x:
                return {"t": "ref", "id": hid}
        tag = _importable(x)
        if tag is not None:
            return tag
        raise self.fail("unsupported_value", f"cannot pass {type(x).__name__} to the program (plain data only)")

    def deref(self, tag: dict):
        kind = tag["t"]
        hid = tag.get("id")
        if kind == "ref":
            if type(hid) is not int:
                raise ProtocolError("bad handle")
            if hid not in self.proxies:
                self.proxies[hid] = Remote(hid)
            return self.proxies[hid]
        if kind == "exc":  # a program-defined exception class: a local stand-in, so `except` works
            if type(hid) is not int:
                raise ProtocolError("bad handle")
            if hid not in self.exc_classes:
                base = _EXCEPTIONS.get(tag.get("base"), Exception)
                self.exc_classes[hid] = type(_str(tag.get("name")), (base,), {"__module__": "solution"})
            return self.exc_classes[hid]
        if kind == "import":  # only a stdlib exception class: nothing the program names runs here
            obj = _import(tag)
            if _plain_exception_class(obj):
                return obj
        raise ProtocolError(f"unexpected tag {kind!r}")

    # -- requests

    def request(self, op: str, *args, kwargs: dict | None = None, **fields):
        """Ask the program; returns plain data or a proxy, re-raises the program's exception here."""
        try:
            req = {"op": op, "a": [encode(a, self.ref) for a in args], **fields}
            if kwargs is not None:
                req["k"] = [[k, encode(v, self.ref)] for k, v in kwargs.items()]
        except RecursionError:
            raise self.fail("unsupported_value", "argument nested too deep") from None
        self.next_id += 1
        rid = str(self.next_id)
        _send(self.out_fd, f"Q {rid} {_dumps(req)}")
        raw = self.cin.readline()
        if not raw:
            os._exit(3)  # the judge went away
        tag, got, payload = (raw.decode("utf-8", "surrogatepass").rstrip("\n").split(" ", 2) + ["", ""])[:3]
        if got != rid or tag not in ("R", "F"):
            raise self.fail("protocol_error", "reply out of order")
        if tag == "F":
            kind = payload if payload in _FAIL_KINDS else "protocol_error"
            raise self.fail(kind, f"the program failed while answering {op}")
        try:
            body = json.loads(payload)
            if type(body) is not dict:
                raise ProtocolError("malformed reply")
            if "raise" in body:
                raised = self._exception(body["raise"])
            elif op == "call":
                value, changed = decode(body["v"], self.deref)
                _restore(args, kwargs or {}, changed)
                return value
            else:
                return decode(body["v"], self.deref)
        except (ProtocolError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError,
                RecursionError) as exc:
            raise self.fail("protocol_error", f"malformed reply: {type(exc).__name__}") from None
        raise raised

    def _exception(self, info) -> BaseException:
        if type(info) is not dict:
            raise ProtocolError("malformed exception")
        cls = decode(info.get("cls"), self.deref)
        args = decode(info.get("args", []), self.deref)
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise ProtocolError("not an exception class")
        if not issubclass(cls, Exception):  # SystemExit, KeyboardInterrupt... raised by the program
            return self.fail("exited" if issubclass(cls, SystemExit) else "runtime_error",
                             f"the program raised {cls.__name__}")
        try:
            exc = cls(*args) if isinstance(args, list) else cls()
        except Exception:
            exc = cls.__new__(cls)
            exc.args = tuple(args) if isinstance(args, list) else ()
        return exc

    def iterate(self, obj: Remote):
        it = self.request("iter", obj)
        if not isinstance(it, Remote):
            raise self.fail("protocol_error", "iter() did not return a handle")
        return _RemoteIterator(self, it)

    def next_item(self, it: Remote, batch: int):
        buf = self.buffers.setdefault(object.__getattribute__(it, "_rid"), collections.deque())
        if not buf:
            got = self.request("next", it, n=batch)
            if type(got) is not tuple or len(got) != 2 or type(got[0]) is not list or type(got[1]) is not bool:
                raise self.fail("protocol_error", "malformed items")
            items, done = got
            buf.extend(items)
            if done:
                buf.append(_END)
        item = buf.popleft()
        if item is _END:
            buf.append(_END)
            raise StopIteration
        return item


def _restore(args: tuple, kwargs: dict, changed) -> None:
    """Apply the program's in-place changes to the test's own list/dict/set/bytearray/deque arguments."""
    for key, new in changed:
        obj = args[key] if type(key) is int and 0 < key < len(args) else kwargs.get(key)
        if type(obj) is not type(new) or type(obj) not in _MUTABLE:
            continue
        if isinstance(obj, (list, bytearray)):
            obj[:] = new
        else:
            obj.clear()
            (obj.extend if isinstance(obj, collections.deque) else obj.update)(new)


_END = object()
_CLIENT: _Client | None = None


class _RemoteIterator:
    """Fetches items in growing batches (1, 2, 4, ... 256) so a long loop costs few round trips."""

    def __init__(self, client: _Client, it: Remote) -> None:
        self.client, self.it, self.batch = client, it, 1

    def __iter__(self):
        return self

    def __next__(self):
        item = self.client.next_item(self.it, self.batch)
        self.batch = min(256, self.batch * 2)
        return item


def _opaque(*_args):
    raise _CLIENT.fail("opaque_value", "a program-made object was compared or truth-tested; tests must "
                                       "compare plain data (numbers, strings, lists, dicts, ...)")


def _binop(name: str, reflected: bool = False):
    def method(self, other):
        return _CLIENT.request(name, other, self) if reflected else _CLIENT.request(name, self, other)
    return method


class Remote:
    """A program object that stays in the serve process; every use is a request."""

    __slots__ = ("_rid",)

    def __init__(self, rid: int) -> None:
        object.__setattr__(self, "_rid", rid)

    def __getattr__(self, name: str):
        if name.startswith("__") and name not in ("__name__", "__qualname__", "__doc__"):
            raise AttributeError(name)
        return _CLIENT.request("getattr", self, name)

    def __setattr__(self, name: str, value) -> None:
        _CLIENT.request("setattr", self, name, value)

    def __delattr__(self, name: str) -> None:
        _CLIENT.request("delattr", self, name)

    def __call__(self, *args, **kwargs):
        return _CLIENT.request("call", self, *args, kwargs=kwargs)

    def __getitem__(self, key):
        return _CLIENT.request("getitem", self, key)

    def __setitem__(self, key, value) -> None:
        _CLIENT.request("setitem", self, key, value)

    def __delitem__(self, key) -> None:
        _CLIENT.request("delitem", self, key)

    def __contains__(self, item) -> bool:
        got = _CLIENT.request("contains", self, item)
        if type(got) is not bool:
            _opaque()
        return got

    def __len__(self) -> int:
        return _CLIENT.request("len", self)

    def __iter__(self):
        return _CLIENT.iterate(self)

    def __next__(self):
        return _CLIENT.next_item(self, 1)

    def __str__(self) -> str:
        return _CLIENT.request("str", self)

    def __repr__(self) -> str:
        return _CLIENT.request("repr", self)

    def __int__(self) -> int:
        return _CLIENT.request("int", self)

    def __float__(self) -> float:
        return _CLIENT.request("float", self)

    def __index__(self) -> int:
        return _CLIENT.request("index", self)

    def __neg__(self):
        return _CLIENT.request("neg", self)

    def __pos__(self):
        return _CLIENT.request("pos", self)

    def __abs__(self):
        return _CLIENT.request("abs", self)

    def __invert__(self):
        return _CLIENT.request("invert", self)

    def __eq__(self, other):
        return True if other is self else _opaque()

    def __ne__(self, other):
        return False if other is self else _opaque()

    __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __instancecheck__ = __subclasscheck__ = _opaque
    __hash__ = object.__hash__


for _name in _BINOPS:
    _dunder = _name.rstrip("_")
    setattr(Remote, f"__{_dunder}__", _binop(_name))
    setattr(Remote, f"__r{_dunder}__", _binop(_name, reflected=True))


def _namespace(client: _Client, tree: ast.AST) -> dict:
    """The test's globals: the program's names it uses (proxies or plain values), never over a builtin;
    and a standard-library module name the test uses as a module (`math.isclose`) is that module, not
    whatever the program bound to the name."""
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    wanted = sorted(n for n in names if not hasattr(builtins, n) and not n.startswith("__"))
    ns: dict = {"__name__": "__main__", "__builtins__": builtins}
    if wanted:
        got = client.request("names", v=wanted)
        if type(got) is not dict or not set(got) <= set(wanted):  # only what was asked: never a builtin
            raise client.fail("protocol_error", "names that were not asked for")
        ns.update(got)
    as_module = {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    for name in as_module & _STDLIB - {"this", "antigravity"}:
        try:
            ns[name] = importlib.import_module(name)
        except ImportError:
            pass
    return ns


_KINDS = ((JudgeFailure, None), (AssertionError, "wrong_answer"), (MemoryError, "memory"),
          (SystemExit, "exited"), (SyntaxError, "syntax_error"))


def run_test(client: _Client, src: str) -> str:
    """The test's error kind ("ok": passed)."""
    client.failure = None
    kind = "ok"
    try:
        tree = ast.parse(src, "test.py")
        exec(compile(tree, "test.py", "exec"), _namespace(client, tree))
    except BaseException as exc:
        kind = next((k or getattr(exc, "kind", "runtime_error") for t, k in _KINDS if isinstance(exc, t)),
                    "runtime_error")
    if client.failure:  # a failure of the program under test wins, even if the test caught it
        kind = client.failure
    return kind


def _no_ptrace() -> None:
    """Other processes of the same uid may not attach to this one (best effort, Linux only). In a pid
    namespace of its own (pid 2: the sandbox's reaper is 1) nothing else can name this process."""
    if os.getpid() <= 2:
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def test() -> None:
    global _CLIENT
    _no_ptrace()
    cin, cout = _channel()
    _send(cout, "UP")
    _CLIENT = client = _Client(cin, cout)
    for raw in cin:
        line = raw.decode("utf-8", "surrogatepass").rstrip("\n")
        if line == "N":
            client.reset()
        elif line.startswith("T "):
            job = json.loads(line[2:])
            _send(cout, "V " + _dumps({"i": job["i"], "kind": run_test(client, job["src"])}))
        else:
            os._exit(4)  # a reply nobody asked for: the judge and this process disagree


def main() -> None:
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)
    {"serve": serve, "test": test}[sys.argv[-1]]()


if __name__ == "__main__":
    main()
