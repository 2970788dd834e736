"""The code judge's sandboxed child, part 3 of 3: `test` runs the tests against proxies of the program's objects,
and `main` picks the role (rlkit/sandbox/_judge_wire.py has the framing and the whole picture)."""

from __future__ import annotations  # child: joined

import ast
import builtins
import collections
import importlib
import json
import os
import sys

from rlkit.sandbox._judge_serve import serve
from rlkit.sandbox._judge_wire import (  # the parts are one program when joined
    _BINOPS,
    _EXCEPTIONS,
    _FAIL_KINDS,
    _MUTABLE,
    _STDLIB,
    ProtocolError,
    _channel,
    _dumps,
    _import,
    _importable,
    _plain_exception_class,
    _send,
    _str,
    decode,
    encode,
)


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
