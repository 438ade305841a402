#!/usr/bin/env python3
"""Writes the seeds of the Python checkpoint structure reader's corpus, fuzz/corpus/structure/
(python/edl/_structure.py; driven by python/tests/test_structure_fuzz.py): structure shards as
edl.checkpoint saves them, and the hostile ones of issue 39, each named for what it is.

    PYTHONPATH=build/python /usr/bin/python3 fuzz/structure_seeds.py

Never unpickle these files with pickle.loads: some ask for unbounded work."""
import os
import pickle
import struct

import torch

from edl.checkpoint import _Ref, _shards

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "structure")

PROTO = b"\x80\x04"
MEMOIZE, POP, STOP, TUPLE2, LIST, MARK = b"\x94", b"0", b".", b"\x86", b"l", b"("


def get(i):
    return b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<I", i)


def memo_bomb(depth):
    """[[x, x], [x, x]]... with each level one memo entry: 2**depth nodes when walked."""
    out = PROTO + b"]" + MEMOIZE
    for k in range(1, depth + 1):
        out += MARK + get(k - 1) + get(k - 1) + LIST + MEMOIZE + (POP if k < depth else b"")
    return out + STOP


def tuple_bomb_key(depth):
    """{((1,), (1,)), ...: None}: hashing the key costs 2**depth."""
    out = PROTO + b"}" + b"K\x01\x85" + MEMOIZE
    for k in range(1, depth + 1):
        out += get(k - 1) + get(k - 1) + TUPLE2 + MEMOIZE + (POP if k < depth else b"")
    return out + b"Ns" + STOP


class _SetOfRange:
    def __reduce__(self):
        return (set, (range(10**12),))


def ref(shape=(4,), dtype="float32", i=0):
    return _Ref(i, dtype, shape, "cpu")


def nested(depth):
    obj = [ref()]
    for _ in range(depth):
        obj = [obj]
    return obj


def cycle():
    loop = [1]
    loop.append(loop)
    return loop


def state_dict():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 3,
            "extra": [1.5, (2, "x"), {1, 2}, frozenset({3}), complex(1, 2), range(3),
                      slice(1, None, 2), b"bytes", None, True]}


def seeds():
    dumps = lambda obj: pickle.dumps(obj, protocol=4)  # noqa: E731
    yield "state-dict", _shards(state_dict())[0][0][1]
    no_bytes = [x for x in state_dict()["extra"] if not isinstance(x, bytes)]  # _codecs in 2
    yield "builtins-p2", pickle.dumps(no_bytes, protocol=2)  # sets and ranges by REDUCE
    yield "duplicate-index", dumps({"a": ref((262144,)), "b": ref((262144,))})
    yield "memo-bomb-24", memo_bomb(24)
    yield "memo-bomb-40", memo_bomb(40)
    yield "tuple-bomb-key", tuple_bomb_key(40)
    yield "set-of-range", dumps(_SetOfRange())
    yield "not-a-pickle", PROTO + b"X\x02\x00\x00\x00\xff\xfe" + STOP  # bad UTF-8
    yield "empty", b""
    yield "truncated", dumps({"w": ref(), "name": "x" * 40})[:30]
    yield "bad-dtype", dumps({"w": ref(dtype="nn")})
    yield "negative-shape", dumps({"w": ref(shape=(-4,))})
    yield "huge-shape", dumps({"w": ref(shape=(2**20, 2**20))})  # 4 TiB, not the shard's 16 B
    yield "int64-shape", dumps({"w": ref(shape=(0, 2**62, 2**62))})
    yield "ref-as-key", dumps({ref(): 1})
    yield "cycle", dumps(cycle())
    yield "deep", dumps(nested(200))


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, raw in seeds():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(raw)
        print(f"{name:16} {len(raw):6} bytes")


if __name__ == "__main__":
    main()
