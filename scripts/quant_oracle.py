#!/usr/bin/env python3
"""Random blocks of every ggml type the importer decodes, and gguf-py's decoding of them.

For converter/tests/quants.rs: each type's decoder must give gguf-py's f32 values bit for
bit. Blocks are random bytes with their f16 scale (and min) fields set to random finite
values, so every bit pattern of the quantized parts is exercised.

usage: python3 scripts/quant_oracle.py converter/tests/data/quants
writes, per type: TYPE.blocks (the raw blocks) and TYPE.f32 (gguf-py's values, little-endian)
needs: numpy, gguf (the oracle venv from ../shared/tools/setup-oracle.sh)
"""
import os, sys

import numpy as np
from gguf import GGMLQuantizationType as T, GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of each type's f16 fields (scale d, and dmin or m where it has one).
HALF_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
BLOCKS = 16

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(20261123)
for qtype, fields in HALF_FIELDS.items():
    _, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (BLOCKS, type_size), dtype=np.uint8)
    for at in fields:
        halves = (rng.normal(0, 0.05, BLOCKS)).astype(np.float16)
        blocks[:, at:at + 2] = halves.view(np.uint8).reshape(BLOCKS, 2)
    values = dequantize(blocks.reshape(-1), qtype).astype("<f4")
    assert np.isfinite(values).all()
    blocks.tofile(os.path.join(out, f"{qtype.name}.blocks"))
    values.tofile(os.path.join(out, f"{qtype.name}.f32"))
    print(qtype.name, values.shape)
