#!/usr/bin/env python3
"""Rewrites a GGUF with its matrices dequantized to BF16 or F32 (vectors to F32), all
metadata kept: the same weights for llama.cpp at the precision the runtime holds them in
(`just bench-llamacpp`).

usage: gguf_dequantize.py IN.gguf OUT.gguf bf16|f32
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

source, target, kind = sys.argv[1], sys.argv[2], sys.argv[3]
if kind not in ("bf16", "f32"):
    sys.exit(f"error: {kind!r} is not bf16 or f32")
reader = GGUFReader(source)
writer = GGUFWriter(target, reader.fields["general.architecture"].contents())
for key, field in reader.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    if key == "general.file_type":  # llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_BF16
        writer.add_uint32(key, 0 if kind == "f32" else 32)
    elif field.types[0] == GGUFValueType.ARRAY:
        writer.add_array(key, field.contents())
    else:
        writer.add_key_value(key, field.contents(), field.types[0])
for tensor in reader.tensors:
    shape = tuple(int(d) for d in reversed(tensor.shape))
    values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
    if kind == "bf16" and values.ndim == 2:
        bf16 = GGMLQuantizationType.BF16
        writer.add_tensor(tensor.name, quantize(values, bf16), raw_dtype=bf16)
    else:
        writer.add_tensor(tensor.name, values)
writer.write_header_to_file()
writer.write_kv_data_to_file()
writer.write_tensors_to_file()
writer.close()
