"""edl._structure: the safe reader of a checkpoint's structure shard (the pickled containers
around edl.checkpoint's tensor references), for bytes that anyone who can write to the store
may have crafted. It bounds the work before it is done:

- ``scan`` walks the pickle's opcodes without building anything and refuses a structure that
  would expand (memo references counted at their full size) to more nodes than a budget
  proportional to its length, or nest deeper than MAX_DEPTH: a memo DAG of ~250 bytes, which
  would take exponential time to hash or walk, is refused in microseconds;
- ``SafeUnpickler`` loads containers, numbers, strings, bytes and a few builtins whose
  constructors cannot be asked for unbounded work (``set(range(10**12))`` is refused);
- ``tensor_refs`` walks the result within the same bounds and checks every tensor reference
  (index once, a known dtype, a bounded non-negative shape) before anything is allocated.

Every refusal is ``Malformed`` with the reason; edl.checkpoint turns it into EDL_EPROTO and
falls back to the previous checkpoint.
"""
import _compat_pickle
import collections
import io
import pickle
import pickletools

import torch

MAX_DEPTH = 100        # containers inside containers (a state_dict nests 4 or 5 deep)
MAX_DIMS = 64          # a tensor's dimensions (no model has more)
_INT64 = 1 << 63
NODES_PER_BYTE = 2     # the budget of nodes, per byte of the structure shard ...
NODES_BASE = 4096      # ... plus this many


class Malformed(Exception):
    """The structure shard cannot be loaded safely; the message says why."""


def budget(raw):
    return NODES_PER_BYTE * len(raw) + NODES_BASE


class _Node:
    """What scan knows of an object on the pickle stack: its expanded size and depth."""

    __slots__ = ("size", "depth")

    def __init__(self, size=1, depth=0):
        self.size, self.depth = size, depth


_MARK = object()
_LEAF = {"NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1",
         "LONG4", "FLOAT", "BINFLOAT", "STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE",
         "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
         "BINBYTES8", "BYTEARRAY8", "GLOBAL", "EMPTY_TUPLE", "EMPTY_LIST", "EMPTY_DICT",
         "EMPTY_SET", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER"}
_TO_MARK = {"TUPLE", "LIST", "DICT", "FROZENSET", "INST", "OBJ"}   # a new object of the items
_INTO = {"APPENDS", "SETITEMS", "ADDITEMS"}                          # items into the object below
_FIXED = {"TUPLE1": 1, "TUPLE2": 2, "TUPLE3": 3, "STACK_GLOBAL": 2, "REDUCE": 2, "NEWOBJ": 2,
          "NEWOBJ_EX": 3}
_ADD = {"APPEND": 1, "SETITEM": 2, "BUILD": 1}                       # into the object below
_MEMO_GET = {"GET", "BINGET", "LONG_BINGET"}
_MEMO_PUT = {"PUT", "BINPUT", "LONG_BINPUT"}
_NOTHING = {"PROTO", "FRAME", "STOP", "READONLY_BUFFER"}


class _Scan:
    def __init__(self, limit):
        self.limit, self.stack, self.memo = limit, [], {}

    def pop_to_mark(self):
        items = []
        while True:
            if not self.stack:
                raise Malformed("a MARK is missing")
            x = self.stack.pop()
            if x is _MARK:
                return items
            items.append(x)

    def pop(self, n):
        if len(self.stack) < n or any(x is _MARK for x in self.stack[len(self.stack) - n:]):
            raise Malformed("the pickle's stack underflows")
        items = self.stack[len(self.stack) - n:]
        del self.stack[len(self.stack) - n:]
        return items

    def grow(self, node, items):
        """node takes items in: its expanded size and depth, each checked."""
        for x in items:
            node.size += x.size
            node.depth = max(node.depth, x.depth + 1)
        if node.size > self.limit:
            raise Malformed(f"it expands to more than {self.limit} objects (shared references "
                            f"counted at their size): a bomb, not a state_dict")
        if node.depth > MAX_DEPTH:
            raise Malformed(f"it nests deeper than {MAX_DEPTH} levels")
        return node

    def top(self):
        if not self.stack or self.stack[-1] is _MARK:
            raise Malformed("the pickle's stack underflows")
        return self.stack[-1]

    def step(self, name, arg):
        if name in _LEAF:
            self.stack.append(_Node())
        elif name in _TO_MARK:
            self.stack.append(self.grow(_Node(), self.pop_to_mark()))
        elif name in _FIXED:
            self.stack.append(self.grow(_Node(), self.pop(_FIXED[name])))
        elif name in _INTO:
            items = self.pop_to_mark()
            self.grow(self.top(), items)
        elif name in _ADD:
            items = self.pop(_ADD[name])
            self.grow(self.top(), items)
        elif name == "MARK":
            self.stack.append(_MARK)
        elif name in _MEMO_PUT:
            if not 0 <= arg <= len(self.memo):  # the unpickler sizes its memo by the index
                raise Malformed(f"memo index {arg} skips ahead of the {len(self.memo)} entries")
            self.memo[arg] = self.top()
        elif name == "MEMOIZE":
            self.memo[len(self.memo)] = self.top()
        elif name in _MEMO_GET:
            if arg not in self.memo:
                raise Malformed(f"memo entry {arg} is read before it is written")
            self.stack.append(self.memo[arg])
        elif name == "POP":
            self.pop(1)
        elif name == "POP_MARK":
            self.pop_to_mark()
        elif name == "DUP":
            self.stack.append(self.top())
        elif name not in _NOTHING:  # PERSID, BINPERSID and anything newer
            raise Malformed(f"opcode {name} is not loaded from a checkpoint")


def scan(raw):
    """Refuse (Malformed) a pickle that is not one, or that expands or nests past the bounds,
    before a single object is built."""
    s = _Scan(budget(raw))
    try:
        for op, arg, pos in pickletools.genops(io.BytesIO(raw)):
            if op.name == "FRAME" and arg > len(raw) - pos:
                raise Malformed(f"a frame of {arg} bytes at byte {pos} runs past the end")
            s.step(op.name, arg)
    except Malformed:
        raise
    except Exception as e:  # noqa: BLE001 - genops refuses truncated or unknown bytes so
        raise Malformed(f"it is not a pickle ({type(e).__name__}: {e})") from None


# ---- bounded constructors ------------------------------------------------------------------

def _need(ok, what):
    if not ok:
        raise pickle.UnpicklingError(f"{what} in a checkpoint")


def _materialised(it, what):
    # a range or another lazy iterable could make set() or frozenset() work without end
    _need(type(it) in (list, tuple, set, frozenset, dict), f"{what} of a {type(it).__name__}")
    return it


def _ints(args, what, none_ok=False):
    _need(all(type(a) is int or (none_ok and a is None) for a in args),
          f"{what} of anything but integers")
    return args


def _set(it=()):
    return set(_materialised(it, "set"))


def _frozenset(it=()):
    return frozenset(_materialised(it, "frozenset"))


def _range(*args):
    return range(*_ints(args, "range"))


def _slice(*args):
    return slice(*_ints(args, "slice", none_ok=True))


def _complex(*args):
    _need(all(type(a) in (int, float) for a in args), "complex of anything but numbers")
    return complex(*args)


def _ordered_dict(*args):
    _need(len(args) <= 1, "OrderedDict of several arguments")
    return collections.OrderedDict(*(_materialised(a, "OrderedDict") for a in args))


class SafeUnpickler(pickle.Unpickler):
    """Containers, numbers, strings, bytes and edl's tensor references only; constructors are
    functions (NEWOBJ refuses them: only REDUCE, with checked arguments, builds them)."""

    _ALLOWED = {("builtins", "set"): _set, ("builtins", "frozenset"): _frozenset,
                ("builtins", "range"): _range, ("builtins", "slice"): _slice,
                ("builtins", "complex"): _complex,
                ("collections", "OrderedDict"): _ordered_dict}

    def find_class(self, module, name):
        # protocol 2's Python 2 names (__builtin__.xrange), mapped as pickle itself maps them
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        if (module, name) == ("edl.checkpoint", "_Ref"):
            return super().find_class(module, name)
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        raise pickle.UnpicklingError(f"{module}.{name} is not loaded from a checkpoint unless "
                                     f"trusted=True")


def load(raw):
    """The structure shard's object (Malformed when unsafe or not a pickle)."""
    scan(raw)
    try:
        return SafeUnpickler(io.BytesIO(raw)).load()
    except Exception as e:  # noqa: BLE001 - whatever the bytes made the unpickler raise
        raise Malformed(f"{type(e).__name__}: {e}") from None


# ---- tensor references ---------------------------------------------------------------------

def _dtype(name):
    d = getattr(torch, name, None) if type(name) is str else None
    if not isinstance(d, torch.dtype):
        raise Malformed(f"a tensor's dtype {name!r} is not a torch dtype")
    return d


class _Walk:
    def __init__(self, ref_type, limit):
        self.ref_type, self.left, self.refs, self.seen = ref_type, limit, [], set()

    def visit(self, obj, depth, placeable):
        self.left -= 1
        if self.left < 0 or depth > MAX_DEPTH:
            raise Malformed("it is larger or deeper than its bytes allow (a cycle?)")
        if type(obj) is self.ref_type:
            if not placeable:
                raise Malformed("a tensor reference is a dict key or in a set")
            self.refs.append(self.check(obj))
        elif isinstance(obj, dict):
            for k, v in obj.items():
                self.visit(k, depth + 1, False)
                self.visit(v, depth + 1, placeable)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                self.visit(v, depth + 1, placeable)
        elif isinstance(obj, (set, frozenset)):
            for v in obj:
                self.visit(v, depth + 1, False)

    def check(self, r):
        i, shape = getattr(r, "i", None), getattr(r, "shape", None)
        if type(i) is not int or i < 0:
            raise Malformed(f"a tensor reference's index {i!r} is not a non-negative integer")
        if i in self.seen:
            raise Malformed(f"tensor {i} is referenced twice")
        self.seen.add(i)
        if (type(shape) is not tuple or len(shape) > MAX_DIMS or
                not all(type(d) is int and 0 <= d < _INT64 for d in shape)):
            raise Malformed(f"tensor {i}'s shape {shape!r:.200} is not a tuple of at most "
                            f"{MAX_DIMS} non-negative integers")
        span = 1
        for d in shape:
            span *= max(d, 1)
        if span >= _INT64:  # torch's strides are int64, even of an empty tensor
            raise Malformed(f"tensor {i}'s shape {shape!r:.200} spans more than 2**63 elements")
        _dtype(getattr(r, "dtype", None))
        if type(getattr(r, "device", None)) is not str:
            raise Malformed(f"tensor {i}'s device is not a string")
        return r


def tensor_refs(obj, ref_type, raw):
    """Every tensor reference in obj, each checked (index once, dtype, shape), in the order of
    a walk that is bounded as scan bounds the bytes."""
    w = _Walk(ref_type, budget(raw))
    w.visit(obj, 0, True)
    return w.refs


def nbytes(r):
    """The bytes tensor reference r's tensor holds (Python integers: no overflow)."""
    n = torch.empty(0, dtype=_dtype(r.dtype)).element_size()
    for d in r.shape:
        n *= d
    return n
