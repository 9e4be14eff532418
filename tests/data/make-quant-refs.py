#!/usr/bin/env python3
"""Reference data for ferry's block formats from an independent implementation.

Writes tests/data/quants/<type>.blocks (raw GGUF blocks), <type>.expected.f32 (their
dequantization by gguf.quants, little-endian float32) and, for the types gguf.quants can
quantize, <type>.input.f32 (the floats whose gguf.quants quantization forms the first blocks
of <type>.blocks). The other blocks are built from a fixed seeded byte generator, with the fp16
scale fields replaced by finite values (zero, subnormal, the largest half, random) so every
quant bit pattern is covered and no block decodes to NaN. tests/test_types.cpp requires
ferry's dequantizer to reproduce <type>.expected.f32 bit for bit and compares ferry's
quantizer's round-trip error with gguf.quants' on <type>.input.f32.

Run (from the repository root; the outputs are committed, so only to regenerate them):
    python3 -m venv .venv && .venv/bin/pip install gguf==0.19.0 numpy
    .venv/bin/python tests/data/make-quant-refs.py
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quants")

# type -> (gguf type, byte offsets of fp16 fields, offset of the E8M0 byte or None)
TYPES = {
    "q5_0": (T.Q5_0, [0], None),
    "q5_1": (T.Q5_1, [0, 2], None),
    "q2_k": (T.Q2_K, [80, 82], None),
    "q3_k": (T.Q3_K, [108], None),
    "iq4_nl": (T.IQ4_NL, [0], None),
    "iq4_xs": (T.IQ4_XS, [0], None),
    "mxfp4": (T.MXFP4, [], 0),
}
QUANTIZED_BLOCKS = 48  # blocks made by gguf.quants.quantize where it can
RANDOM_BLOCKS = {32: 48, 256: 16}  # by block size


def inputs(rng, n_blocks, block):
    """Rows of normal values with a per-block magnitude from 1e-3 to 10, plus edge blocks."""
    x = rng.standard_normal((n_blocks, block)).astype(np.float32)
    x *= (10.0 ** rng.uniform(-3, 1, size=(n_blocks, 1))).astype(np.float32)
    x[0] = 0.0  # all zero
    x[1] = 0.75  # constant
    x[2] = np.float32(1e-3) * x[2]
    x[2, 5] = 3.0  # one outlier
    x[3] = np.abs(x[3])  # all positive
    return x.astype(np.float32)


def fix_scales(rng, blocks, f16_offsets, e8m0_offset):
    n = blocks.shape[0]
    special = np.array([0.0, -0.0, 2.0**-24, 65504.0, -65504.0, 2.0**-14, 1.0], dtype=np.float16)
    for off in f16_offsets:
        vals = (rng.uniform(-4, 4, size=n) * 2.0 ** rng.integers(-20, 4, size=n)).astype(np.float16)
        vals[: len(special)] = np.roll(special, off)[: min(n, len(special))]
        assert np.all(np.isfinite(vals))
        blocks[:, off : off + 2] = vals.view(np.uint8).reshape(n, 2)
    if e8m0_offset is not None:
        edge = np.array([0, 1, 2, 126, 127, 128, 254, 255], dtype=np.uint8)
        blocks[: len(edge), e8m0_offset] = edge


def main():
    os.makedirs(OUT, exist_ok=True)
    for name, (qt, f16_offsets, e8m0_offset) in TYPES.items():
        block, type_size = GGML_QUANT_SIZES[qt]
        rng = np.random.default_rng(sum(map(ord, name)))  # fixed seed per type
        parts = []
        x = None
        try:
            x = inputs(rng, QUANTIZED_BLOCKS, block)
            q = quants.quantize(x, qt)
            parts.append(np.asarray(q, dtype=np.uint8).reshape(QUANTIZED_BLOCKS, type_size))
        except NotImplementedError:
            x = None
        nr = RANDOM_BLOCKS[block]
        rb = rng.integers(0, 256, size=(nr, type_size), dtype=np.uint8)
        fix_scales(rng, rb, f16_offsets, e8m0_offset)
        parts.append(rb)
        blocks = np.concatenate(parts, axis=0)
        y = quants.dequantize(blocks.reshape(-1), qt).astype(np.float32).reshape(-1)
        assert y.size == blocks.shape[0] * block
        blocks.tofile(os.path.join(OUT, name + ".blocks"))
        y.astype("<f4").tofile(os.path.join(OUT, name + ".expected.f32"))
        inp = os.path.join(OUT, name + ".input.f32")
        if x is not None:
            x.astype("<f4").reshape(-1).tofile(inp)
        elif os.path.exists(inp):
            os.remove(inp)
        print(f"{name}: {blocks.shape[0]} blocks ({0 if x is None else QUANTIZED_BLOCKS} quantized by gguf)",
              file=sys.stderr)


if __name__ == "__main__":
    main()
