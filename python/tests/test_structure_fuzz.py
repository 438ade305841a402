"""Fuzzing of the checkpoint structure reader (python/edl/_structure.py), which libFuzzer cannot
reach from C: every seed of fuzz/corpus/structure/ and mutations of them (bit flips, byte
insertions and deletions, splices of two seeds, pickle opcodes dropped in), each either loaded
with its tensor references checked or refused as Malformed, fast. Anything else (another
exception, a hang, unbounded memory) fails. Deterministic: the same inputs every run.

    EDL_FUZZ_SECONDS=600 python3 -m pytest python/tests/test_structure_fuzz.py   # longer
"""
import os
import random
import resource
import time

import pytest

pytest.importorskip("torch")  # Debian: python3-torch (scripts/install-deps)

from edl import _structure
from edl.checkpoint import _Ref

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fuzz", "corpus",
                      "structure")
SECONDS = float(os.environ.get("EDL_FUZZ_SECONDS", "5"))
OPCODES = [b"(", b"]", b"}", b")", b"\x8f", b"\x94", b"h\x00", b"h\x01", b"j\x00\x00\x00\x00",
           b"R", b"\x81", b"\x92", b"b", b"a", b"e", b"s", b"u", b"\x90", b"\x91", b"t", b"l",
           b"\x85", b"\x86", b"\x87", b"0", b"1", b"2", b"K\xff", b"N", b"\x93", b".", b"Q",
           b"P", b"\x82", b"\x95\x00\x00\x00\x00\x00\x00\x00\x00",
           b"\x8c\x08builtins\x94\x8c\x05range\x94\x93",
           b"\x8c\x08builtins\x94\x8c\x03set\x94\x93",
           b"\x8c\x0eedl.checkpoint\x94\x8c\x04_Ref\x94\x93"]


def seeds():
    out = {}
    for name in sorted(os.listdir(CORPUS)):
        with open(os.path.join(CORPUS, name), "rb") as f:
            out[name] = f.read()
    return out


def mutate(rng, raw, other):
    b = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        what = rng.randrange(5)
        at = rng.randrange(len(b) + 1)
        if what == 0 and b:
            b[min(at, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif what == 1:
            b[at:at] = bytes([rng.randrange(256)])
        elif what == 2 and b:
            del b[at:at + rng.randint(1, 8)]
        elif what == 3:
            b[at:at] = rng.choice(OPCODES)
        else:
            cut = rng.randrange(len(other) + 1)
            b = b[:at] + other[cut:cut + rng.randint(1, 64)]
    return bytes(b)


def read(raw):
    """The reader's verdict on raw: True (loaded), or the Malformed reason."""
    try:
        obj = _structure.load(raw)
        for r in _structure.tensor_refs(obj, _Ref, raw):
            _structure.nbytes(r)
        return True
    except _structure.Malformed as e:
        return str(e)


def test_every_seed_is_read_or_refused_as_malformed():
    for name, raw in seeds().items():
        t0 = time.monotonic()
        verdict = read(raw)
        assert time.monotonic() - t0 < 1.0, name
        assert (verdict is True) == name.startswith(("state-dict", "builtins", "huge-shape")), \
            f"{name}: {verdict}"


def test_mutated_structures_are_read_or_refused_fast():
    corpus = list(seeds().values())
    rng = random.Random(39)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    deadline = time.monotonic() + SECONDS
    runs = refused = 0
    while time.monotonic() < deadline:
        raw = mutate(rng, rng.choice(corpus), rng.choice(corpus))
        t0 = time.monotonic()
        if read(raw) is not True:
            refused += 1
        took = time.monotonic() - t0
        assert took < 2.0, f"{took:.1f} s on {raw!r}"
        runs += 1
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"structure fuzz: {runs} inputs, {refused} refused, max RSS grew {grown_mib:.0f} MiB")
    assert runs > 100
    # AddressSanitizer's quarantine holds freed memory (up to 256 MiB): RSS says nothing there
    assert grown_mib < 512 or os.environ.get("EDL_SANITIZED")
