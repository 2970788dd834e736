"""The code judge's sandboxed child, part 2 of 3: `serve` loads the program under test and answers requests
on its objects with plain data (rlkit/sandbox/_judge_wire.py has the framing and the whole picture)."""

from __future__ import annotations  # child: joined

import builtins
import json
import operator
import os

from rlkit.sandbox._judge_wire import (  # the parts are one program when joined
    _BINOPS,
    _EXCEPTIONS,
    _INLINE_GLOBAL_BYTES,
    _MUTABLE,
    _UNOPS,
    ProtocolError,
    _channel,
    _dumps,
    _import,
    _importable,
    _list,
    _pair,
    _plain_exception_class,
    _send,
    _stdlib_module,
    _str,
    decode,
    encode,
)


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
