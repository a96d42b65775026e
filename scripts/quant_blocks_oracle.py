#!/usr/bin/env python3
"""Fixtures for kernels/tests/quant.rs: gguf-py's quantizing and decoding of ggml blocks.

The runtime keeps weights as ggml blocks (kernels/src/quant/). Its quantizer must make
the bytes gguf-py's `gguf.quants.quantize` makes, and its decoder the f32 values gguf-py's
`gguf.quants.dequantize` gives, bit for bit. This script writes what gguf-py makes of:

- quantize.f32: blocks of 32 f32 inputs chosen to be hard (see `quantize_cases`), one case
  name per block in quantize.cases; Q8_0.quantized and Q4_0.quantized: gguf-py's bytes.
- TYPE.blocks for Q8_0, Q4_0, Q5_0, Q4_K, Q6_K: random blocks (random bytes, the f16 scale
  fields set to random finite values, half of them small normals, half any finite f16 bit
  pattern: subnormals, zeros of both signs, up to 65504); TYPE.f32: gguf-py's values.

It also quantizes the same inputs with llama.cpp's own quantizer (`ggml_quantize_chunk` in
the libggml-base that the `llama_cpp` package ships, through ctypes, no importance matrix,
which runs `quantize_row_q8_0_ref` / `quantize_row_q4_0_ref`), writes its bytes to
TYPE.ggml.quantized, and prints the blocks where the two oracles differ. gguf-py's bytes
are the ones the test requires (the oracle the issue names); ggml's let a failure say which
oracle the runtime followed instead. On these inputs they differ in one block: Q4_0 of a
block of -0.0s, where gguf-py takes the sign of the first value of largest magnitude
(-0.0, so d = -0.0 / -8 = +0.0) and ggml, finding no value larger than 0, keeps max = +0.0
(d = -0.0). Every other block of both types is the same in both.

For the K types, which gguf-py does not quantize, llama.cpp's quantizer is the only oracle
(`quantize_row_q4_K_ref` / `quantize_row_q6_K_ref`, what llama-quantize writes without an
importance matrix). See `write_k_quantize_fixtures`: k_quantize.f32 (hard blocks of 256,
and blocks found to sit where an ulp changes ggml's scales: `k_edge_blocks`),
k_quantize.bf16 (random blocks of 256, stored as bf16), k_quantize.cases (one name per
block, the f32 blocks first), Q4_K.ggml.quantized and Q6_K.ggml.quantized.

usage: target/llamacpp/venv/bin/python scripts/quant_blocks_oracle.py [runtime/tests/data/quant]
needs: numpy and gguf (the venv of target/llamacpp); llama_cpp for the second oracle (its
absence is reported and the comparison skipped).
"""
import ctypes
import os
import sys
import warnings

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = sys.argv[1] if len(sys.argv) > 1 else "kernels/tests/data/quant"
QUANTIZED = [T.Q8_0, T.Q4_0]
# Byte offsets of each decoded type's f16 scale fields (d, and dmin for Q4_K).
HALF_FIELDS = {T.Q8_0: [0], T.Q4_0: [0], T.Q5_0: [0], T.Q4_K: [0, 2], T.Q6_K: [208]}
DECODE_BLOCKS = 16

rng = np.random.default_rng(20261124)
f32 = np.float32


def ulps_from(x, k):
    """The f32 `k` representable steps from `x` (toward +inf in magnitude for positive k)."""
    return (np.array([x], f32).view(np.int32) + np.int32(k)).view(f32)[0]


def normals(scale, n=1):
    return (rng.normal(0, 1, (n, 32)) * scale).astype(f32)


def q8_rounding_window(amax):
    """A block whose largest magnitude is `amax` at index 0 and whose other values sit a few
    ulps either side of x * id = k + 0.5, where the f32 product may round onto the tie."""
    d = f32(amax) / f32(127)
    id_ = f32(1) / d
    block = np.zeros(32, f32)
    block[0] = amax
    for i in range(1, 32):
        k = int(rng.integers(-126, 126))
        block[i] = ulps_from(f32(k + 0.5) / id_, int(rng.integers(-3, 4)))
    return block


def q4_rounding_window(max_value):
    """A block whose largest magnitude is `max_value` (signed) at index 0 and whose other
    values sit a few ulps either side of x * id + 8.5 = n: where the f32 product and sum
    round onto the integer although the exact value is just below it (and the other way)."""
    d = f32(max_value) / f32(-8)
    id_ = f32(1) / d
    block = np.zeros(32, f32)
    block[0] = max_value
    for i in range(1, 32):
        n = int(rng.integers(1, 16))
        block[i] = ulps_from(f32(n - 8.5) / id_, int(rng.integers(-3, 4)))
    assert np.abs(block).argmax() == 0
    return block


def quantize_cases():
    """(name, blocks of 32 f32) pairs: each goes through both quantizers."""
    cases = []
    for scale in [1e-3, 0.02, 1.0, 100.0, 1e4]:
        cases.append((f"normal*{scale:g}", normals(scale, 6)))
    cases.append(("zeros", np.zeros((1, 32), f32)))
    cases.append(("negative zeros", np.full((1, 32), -0.0, f32)))
    one = np.zeros((1, 32), f32)
    one[0, 17] = 0.3
    cases.append(("one nonzero", one))
    # Q8_0 with d = amax / 127 a power of two: x * id exact, half steps exact ties.
    for d in [1.0, 0.125]:
        block = ((rng.integers(-126, 126, 32) + 0.5) * d).astype(f32)
        block[5] = 127 * d
        cases.append((f"q8_0 ties at half steps, d={d:g}", block[None]))
    # Q4_0 with d = max / -8 a power of two, either sign: x * id + 8.5 lands on integers.
    for max_value in [-8.0, 8.0, -2.0]:
        d = max_value / -8
        block = ((rng.integers(1, 16, 32) - 8.5) * d).astype(f32)
        block[9] = max_value
        cases.append((f"q4_0 ties at half steps, max={max_value:g}", block[None]))
    for amax in [1.1, 0.37, 23.0]:
        cases.append((f"q8_0 f32 rounding onto half steps, amax={amax:g}",
                      q8_rounding_window(amax)[None]))
    for max_value in [-1.1, 0.37, -23.0, 0.0123]:
        cases.append((f"q4_0 f32 rounding onto code boundaries, max={max_value:g}",
                      q4_rounding_window(max_value)[None]))
    # The largest magnitude twice, with opposite signs: Q4_0 takes the first one's sign.
    for first, second, a in [(3, 20, 0.5), (20, 3, 0.5), (0, 31, 7.0)]:
        block = normals(a / 10)[0]
        block[first], block[second] = a, -a
        cases.append((f"max magnitude +{a:g} at {first}, -{a:g} at {second}", block[None]))
    # Scales at the ends of f16's range and past them.
    cases.append(("normal*1e-6 (d an f16 subnormal)", normals(1e-6, 2)))
    cases.append(("normal*1e-9 (d under f16's range)", normals(1e-9, 2)))
    cases.append(("normal*1e-30", normals(1e-30, 1)))
    cases.append(("f32 subnormals (1 / d overflows to inf)", normals(1e-40, 1)))
    cases.append(("normal*1e7 (d over f16's range)", normals(1e7, 2)))
    cases.append(("normal*1e37", normals(1e37, 1)))
    for d in [65504.0, 65519.0, 65520.0]:
        block = normals(d)[0]
        block[0] = d * 127
        cases.append((f"q8_0 d={d:g} (the largest f16 is 65504)", block[None]))
        block = normals(d)[0]
        block[0] = d * -8
        cases.append((f"q4_0 d={d:g} (the largest f16 is 65504)", block[None]))
    spike = normals(1e-4)[0]
    spike[11] = 300.0
    cases.append(("one large value among tiny ones", spike[None]))
    return cases


def ggml_quantizer():
    """`ggml_quantize_chunk` from the llama_cpp package's libggml-base, or None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    lib_dir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    lib = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]

    def run(values, qtype):
        values = np.ascontiguousarray(values, f32)
        block_values, type_size = GGML_QUANT_SIZES[qtype]
        n_blocks = values.size // block_values
        out = np.zeros(n_blocks * type_size, np.uint8)
        # type, src, dst, start, nrows, n_per_row, imatrix: one block a row
        written = fn(int(qtype), values.ctypes.data, out.ctypes.data, 0, n_blocks,
                     block_values, None)
        assert written == out.size, (written, out.size)
        return out

    return run


def write_quantize_fixtures():
    cases = quantize_cases()
    names = [name for name, blocks in cases for _ in blocks]
    values = np.concatenate([blocks for _, blocks in cases]).astype("<f4")
    assert values.shape[1] == 32 and "\n" not in "".join(names)
    values.tofile(os.path.join(OUT, "quantize.f32"))
    with open(os.path.join(OUT, "quantize.cases"), "w") as f:
        f.write("\n".join(names) + "\n")
    ggml = ggml_quantizer()
    disagreements = 0
    for qtype in QUANTIZED:
        type_size = GGML_QUANT_SIZES[qtype][1]
        # numpy warns of the overflows and of casting inf and NaN to integers (the f32
        # subnormal case), as ggml's C does them silently; neither changes the bytes.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ours = quantize(values, qtype).reshape(-1, type_size)
        ours.tofile(os.path.join(OUT, f"{qtype.name}.quantized"))
        if ggml is None:
            print(f"{qtype.name}: {len(names)} blocks; llama_cpp not importable, "
                  "ggml's quantizer not compared")
            continue
        theirs = ggml(values, qtype).reshape(-1, type_size)
        theirs.tofile(os.path.join(OUT, f"{qtype.name}.ggml.quantized"))
        differ = [i for i in range(len(names)) if (ours[i] != theirs[i]).any()]
        disagreements += len(differ)
        if not differ:
            print(f"{qtype.name}: {len(names)} blocks; gguf-py and ggml_quantize_chunk agree "
                  "on every byte")
        for i in differ:
            print(f"{qtype.name}: block {i} ({names[i]}): gguf-py {ours[i].tolist()} "
                  f"ggml {theirs[i].tolist()}")
    return disagreements


def write_decode_fixtures():
    for qtype, fields in HALF_FIELDS.items():
        type_size = GGML_QUANT_SIZES[qtype][1]
        blocks = rng.integers(0, 256, (DECODE_BLOCKS, type_size), dtype=np.uint8)
        half = DECODE_BLOCKS // 2
        for at in fields:
            small = rng.normal(0, 0.05, half).astype(np.float16)
            bits = rng.integers(0, 1 << 16, 4 * DECODE_BLOCKS, dtype=np.uint16).view(np.float16)
            anything = bits[np.isfinite(bits)][:DECODE_BLOCKS - half]
            halves = np.concatenate([small, anything])
            assert len(halves) == DECODE_BLOCKS
            blocks[:, at:at + 2] = halves.view(np.uint8).reshape(DECODE_BLOCKS, 2)
        values = dequantize(blocks.reshape(-1), qtype).astype("<f4")
        assert np.isfinite(values).all()
        blocks.tofile(os.path.join(OUT, f"{qtype.name}.blocks"))
        values.tofile(os.path.join(OUT, f"{qtype.name}.f32"))
        print(f"{qtype.name}: {DECODE_BLOCKS} blocks decoded")


K_QUANTIZED = [T.Q4_K, T.Q6_K]
# Its own generator, so that adding K cases leaves the fixtures above as they were.
k_rng = np.random.default_rng(20261125)


def k_normals(scale, n=1):
    return (k_rng.normal(0, 1, (n, 256)) * scale).astype(f32)


def k_quantize_cases():
    """(name, blocks of 256 f32) pairs of inputs where the K quantizers' searches and
    special cases are exercised: every group's fit, the block scales' extremes, groups that
    are all zero, all one value, or of one sign (the fitted min of Q4_K clamps to 0)."""
    cases = []
    for scale in [1e-3, 0.02, 1.0, 100.0, 1e4]:
        cases.append((f"normal*{scale:g}", k_normals(scale, 2)))
    cases.append(("zeros", np.zeros((1, 256), f32)))
    cases.append(("negative zeros", np.full((1, 256), -0.0, f32)))
    for value in [0.5, -0.5, 3e-3]:
        cases.append((f"all {value:g}", np.full((1, 256), value, f32)))
    for at, value in [(0, 2.0), (77, -2.0), (255, 1.0)]:
        block = k_normals(0.02)
        block[0, at] = value
        cases.append((f"one outlier {value:g} at {at} among normal*0.02", block))
    spike = k_normals(1e-4)
    spike[0, 130] = 300.0
    cases.append(("one large value among tiny ones", spike))
    cases.append(("all positive (uniform 0.01..1)",
                  k_rng.uniform(0.01, 1, (1, 256)).astype(f32)))
    cases.append(("all negative (uniform -1..-0.01)",
                  k_rng.uniform(-1, -0.01, (1, 256)).astype(f32)))
    block = np.abs(k_normals(0.05))
    block[0, 1::2] *= -1
    cases.append(("alternating signs", block))
    block = k_normals(0.05)
    for g in range(0, 16, 2):
        block[0, 16 * g:16 * g + 16] = np.abs(block[0, 16 * g:16 * g + 16])
        block[0, 16 * g + 16:16 * g + 32] = -np.abs(block[0, 16 * g + 16:16 * g + 32])
    cases.append(("groups of 16 alternately all positive and all negative", block))
    block = k_normals(0.05)
    block[0, 64:96] = 0
    block[0, 160:176] = 0
    cases.append(("normal*0.05 with zero groups", block))
    block = k_normals(0.05)
    block[0, 32:64] = 0.125
    block[0, 192:208] = -0.0625
    cases.append(("normal*0.05 with constant groups", block))
    block = k_normals(0.05)
    block[0, :128] *= 1e-3
    cases.append(("normal, half the block 1000 times smaller", block))
    block = k_normals(0.05)
    block[0, 96:128] = k_rng.integers(-8, 8, 32) * np.float32(0.01)
    cases.append(("normal*0.05 with a group on a grid of 0.01", block))
    cases.append(("integers -8..7", k_rng.integers(-8, 8, (1, 256)).astype(f32)))
    cases.append(("integers -32..31", k_rng.integers(-32, 32, (1, 256)).astype(f32)))
    cases.append(("normal*1e-6 (scales f16 subnormals)", k_normals(1e-6)))
    cases.append(("normal*1e-9 (scales under f16's range)", k_normals(1e-9)))
    cases.append(("normal*1e-14 (near the all-zero threshold 1e-15)", k_normals(1e-14)))
    cases.append(("normal*1e-16 (under the all-zero threshold)", k_normals(1e-16)))
    cases.append(("normal*1e5 (Q4_K's d near f16's largest)", k_normals(1e5)))
    cases.append(("student-t, 3 degrees, *0.02", (k_rng.standard_t(3, (2, 256)) * 0.02).astype(f32)))
    return cases


def to_bf16(values):
    """f32 to bf16 bits, rounding to nearest even (as torch does)."""
    bits = np.ascontiguousarray(values, f32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def k_random_blocks(n):
    """`n` random blocks as bf16 (the form most weights reach the runtime in, and half the
    bytes of f32): normals, heavy tails and uniforms, at weight-like scales."""
    scales = np.float32(10.0) ** k_rng.uniform(-3, 0, (n, 1)).astype(f32)
    kind = k_rng.integers(0, 3, n)
    values = np.where(kind[:, None] == 0, k_rng.normal(0, 1, (n, 256)),
                      np.where(kind[:, None] == 1, k_rng.standard_t(4, (n, 256)),
                               k_rng.uniform(-1, 1, (n, 256))))
    names = [f"random bf16 {['normal', 'student-t 4', 'uniform'][k]}*{s:.3g}"
             for k, s in zip(kind, scales[:, 0])]
    return names, to_bf16((values * scales).astype(f32))


K_RANDOM_BLOCKS = 160
# Each type's fixture holds this many blocks found to sit on one of its decision edges.
K_EDGE_BLOCKS = 32
# Header bytes (d, dmin, the block's scales) of each K type, which the searches decide.
K_HEADERS = {T.Q4_K: slice(0, 16), T.Q6_K: slice(192, 210)}


def k_edge_blocks(ggml, qtype, candidates=4096):
    """Blocks on an edge of `qtype`'s searches: f32 random blocks whose scale bytes ggml
    changes when every input moves by at most an ulp. Random inputs rarely land there (one
    block in fifty), yet there a sum rounded differently than ggml rounds it changes the
    bytes, so these are the blocks that catch an operation done in another order."""
    scales = np.float32(10.0) ** k_rng.uniform(-3, 1, (candidates, 1)).astype(f32)
    heavy = k_rng.integers(0, 2, candidates).astype(bool)
    values = np.where(heavy[:, None], k_rng.standard_t(4, (candidates, 256)),
                      k_rng.normal(0, 1, (candidates, 256)))
    values = (values * scales).astype(f32)
    nudged = (values.view(np.int32)
              + k_rng.integers(-1, 2, values.shape).astype(np.int32)).view(f32)
    size = GGML_QUANT_SIZES[qtype][1]
    header = K_HEADERS[qtype]
    changed = (ggml(values, qtype).reshape(-1, size)[:, header]
               != ggml(nudged, qtype).reshape(-1, size)[:, header]).any(axis=1)
    found = np.flatnonzero(changed)
    assert len(found) >= K_EDGE_BLOCKS, (qtype.name, len(found))
    found = found[:K_EDGE_BLOCKS]
    names = [f"{qtype.name} edge: {'student-t 4' if heavy[i] else 'normal'}*{scales[i, 0]:.3g}"
             for i in found]
    return names, values[found]


def write_k_quantize_fixtures():
    ggml = ggml_quantizer()
    if ggml is None:
        print("llama_cpp not importable: no K-quant fixtures (ggml is their only oracle)")
        return
    cases = k_quantize_cases()
    for qtype in K_QUANTIZED:
        edge_names, edge_blocks = k_edge_blocks(ggml, qtype)
        cases.extend(zip(edge_names, edge_blocks[:, None]))
    names = [name for name, blocks in cases for _ in blocks]
    hard = np.concatenate([blocks for _, blocks in cases]).astype("<f4")
    random_names, random_bits = k_random_blocks(K_RANDOM_BLOCKS)
    assert "\n" not in "".join(names + random_names)
    hard.tofile(os.path.join(OUT, "k_quantize.f32"))
    random_bits.astype("<u2").tofile(os.path.join(OUT, "k_quantize.bf16"))
    with open(os.path.join(OUT, "k_quantize.cases"), "w") as f:
        f.write("\n".join(names + random_names) + "\n")
    random_values = (random_bits.astype(np.uint32) << 16).view(f32)
    values = np.concatenate([hard, random_values])
    for qtype in K_QUANTIZED:
        out = ggml(values, qtype)
        out.tofile(os.path.join(OUT, f"{qtype.name}.ggml.quantized"))
        print(f"{qtype.name}: {len(names)} hard and {K_RANDOM_BLOCKS} random blocks quantized "
              "by ggml_quantize_chunk")


os.makedirs(OUT, exist_ok=True)
disagreements = write_quantize_fixtures()
print(f"gguf-py and ggml differ in {disagreements} blocks (listed above, if any)")
write_decode_fixtures()
write_k_quantize_fixtures()
