#!/usr/bin/env python3
"""Seeds for fuzz_remote (tests/fuzz/fuzz_remote.cpp): one valid graph per op family, written
from the wire format of docs/remote-protocol.md, so that the fuzzer starts from graphs that pass
validation and run their kernels (the byte-level mutator rarely assembles one: a result's shape
must follow from its sources and parameters).

Each seed: BUFFER_ALLOC of 64 KiB (its handle is 0x100000001 in the fuzz target's session), a
TENSOR_SET filling it with deterministic bytes (random floats in [-2, 2) where the graph reads
floats, valid indices where it reads I32, quantized blocks as they come), then GRAPH_COMPUTE
with the graph's table. Writes tests/fuzz/seeds/remote/<name>.

    python3 tests/fuzz/make-remote-seeds.py
"""
import os
import random
import struct

HANDLE = (1 << 32) | 1
BUF = 64 << 10
MAX_LEN = 16384  # the runs' -max_len (docs/remote-protocol.md): longer inputs are cut

# GGUF type ids and (block elements, block bytes).
F32, F16, Q4_0, Q8_0, Q4_K, Q6_K, I32 = 0, 1, 2, 8, 12, 14, 26
BLOCK = {F32: (1, 4), F16: (1, 2), I32: (1, 4), Q4_0: (32, 18), Q8_0: (32, 34),
         Q4_K: (256, 144), Q6_K: (256, 210)}
# ops.def order.
OPS = ["NONE", "CPY", "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "SET_ROWS",
       "ADD", "MUL", "SCALE", "RMS_NORM", "NORM", "MUL_MAT", "SOFT_MAX", "ROPE", "FLASH_ATTN_EXT",
       "SILU", "GELU", "SWIGLU", "GEGLU", "ARGMAX", "SUM_ROWS", "TOP_K"]
IN, OUT = 1, 2


def fbits(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


class Graph:
    def __init__(self):
        self.entries = []  # (fields, fill) per entry
        self.offs = 0

    def place(self, nbytes):
        at = self.offs
        self.offs = (self.offs + nbytes + 63) // 64 * 64
        assert self.offs <= BUF
        return at

    def tensor(self, type_, ne, op="NONE", src=(), params=(), fill=None, flags=0):
        ne = list(ne) + [1] * (4 - len(ne))
        be, bb = BLOCK[type_]
        assert ne[0] % be == 0
        nb = [bb]
        nb.append(ne[0] // be * bb)
        for d in range(2, 4):
            nb.append(nb[d - 1] * ne[d - 1])
        nbytes = nb[3] * ne[3]
        offs = self.place(nbytes)
        p = list(params) + [0] * (8 - len(params))
        s = list(src) + [-1] * (4 - len(src))
        e = struct.pack("<QQI", HANDLE, offs, type_)
        e += struct.pack("<4q", *ne) + struct.pack("<4Q", *nb)
        e += struct.pack("<I", OPS.index(op)) + struct.pack("<8i", *p)
        e += struct.pack("<4i", *s) + struct.pack("<iQ", -1, 0)
        e += struct.pack("<I", flags | (OUT if op != "NONE" else IN))
        self.entries.append((e, (offs, nbytes, type_, fill)))
        return len(self.entries) - 1


def frame(cmd, payload):
    return struct.pack("<HI", cmd, len(payload)) + payload


def seed(g, rng):
    data = bytearray(BUF)
    for _, (offs, nbytes, type_, fill) in g.entries:
        if fill is None:
            continue
        if type_ == I32:
            vals = [rng.randrange(fill) for _ in range(nbytes // 4)]
            data[offs:offs + nbytes] = struct.pack("<%di" % len(vals), *vals)
        elif type_ == F32:
            vals = [rng.uniform(-2, 2) for _ in range(nbytes // 4)]
            data[offs:offs + nbytes] = struct.pack("<%df" % len(vals), *vals)
        elif type_ == F16:
            vals = [rng.uniform(-2, 2) for _ in range(nbytes // 2)]
            data[offs:offs + nbytes] = struct.pack("<%de" % len(vals), *vals)
        else:  # quantized blocks: random bytes (scales included)
            data[offs:offs + nbytes] = bytes(rng.randrange(256) for _ in range(nbytes))
    out = frame(5, struct.pack("<IBQ", 0, 0, BUF))  # BUFFER_ALLOC dev 0, device kind
    out += frame(8, struct.pack("<QQQ", HANDLE, 0, g.offs) + bytes(data[:g.offs]))  # TENSOR_SET
    table = b"".join(e for e, _ in g.entries)
    out += frame(12, struct.pack("<IBI", 0, 0, len(g.entries)) + table)  # GRAPH_COMPUTE, full
    return out


def cases():
    def mul_mat(t, k, m, n):
        g = Graph()
        a = g.tensor(t, [k, m], fill=True)
        b = g.tensor(F32, [k, n], fill=True)
        g.tensor(F32, [m, n], "MUL_MAT", [a, b])
        return g

    yield "mul_mat_q4_0", mul_mat(Q4_0, 64, 8, 3)
    yield "mul_mat_q8_0_vec", mul_mat(Q8_0, 128, 16, 1)
    yield "mul_mat_q4_k", mul_mat(Q4_K, 256, 4, 2)
    yield "mul_mat_q6_k", mul_mat(Q6_K, 256, 4, 2)
    yield "mul_mat_f16", mul_mat(F16, 32, 16, 5)

    g = Graph()
    a = g.tensor(Q8_0, [32, 10], fill=True)
    i = g.tensor(I32, [4], fill=10)
    g.tensor(F32, [32, 4], "GET_ROWS", [a, i])
    yield "get_rows_q8_0", g

    g = Graph()
    x = g.tensor(F32, [64, 4, 3], fill=True)
    pos = g.tensor(I32, [3], fill=4096)
    g.tensor(F32, [64, 4, 3], "ROPE", [x, pos], [64, 0, fbits(10000.0), fbits(1.0)])
    yield "rope", g

    g = Graph()
    q = g.tensor(F32, [32, 2, 4], fill=True)
    k = g.tensor(F16, [32, 32, 2], fill=True)
    v = g.tensor(F16, [32, 32, 2], fill=True)
    m = g.tensor(F16, [32, 2], fill=True)
    g.tensor(F32, [32, 4, 2], "FLASH_ATTN_EXT", [q, k, v, m], [fbits(0.18)])
    yield "flash_attn_ext", g

    g = Graph()
    x = g.tensor(F32, [32, 4], fill=True)
    m = g.tensor(F32, [32, 4], fill=True)
    g.tensor(F32, [32, 4], "SOFT_MAX", [x, m], [fbits(1.0)])
    yield "soft_max", g

    for op in ("RMS_NORM", "NORM"):
        g = Graph()
        x = g.tensor(F32, [64, 3], fill=True)
        g.tensor(F32, [64, 3], op, [x], [fbits(1e-5)])
        yield op.lower(), g

    for op in ("SWIGLU", "GEGLU", "MUL", "ADD"):
        g = Graph()
        a = g.tensor(F32, [32, 3], fill=True)
        b = g.tensor(F32, [32, 3 if op.endswith("GLU") else 1], fill=True)
        g.tensor(F32, [32, 3], op, [a, b])
        yield op.lower(), g

    for op, out_type, ne in (("ARGMAX", I32, [3]), ("SUM_ROWS", F32, [1, 3]),
                             ("TOP_K", F32, [10, 3])):
        g = Graph()
        x = g.tensor(F32, [50, 3], fill=True)
        g.tensor(out_type, ne, op, [x], [5] if op == "TOP_K" else [])
        yield op.lower(), g


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds", "remote")
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(34)
    for name, g in cases():
        data = seed(g, rng)
        assert len(data) <= MAX_LEN, (name, len(data))
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
        print(name)


if __name__ == "__main__":
    main()
