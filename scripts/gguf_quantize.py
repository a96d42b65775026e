#!/usr/bin/env python3
"""A GGUF quantized by llama.cpp's own quantizer (`llama_model_quantize`, what llama-quantize
runs), for `just bench-llamacpp`: llama.cpp's file of the same values our runtime quantizes
at load (`--weights q8_0|q4_0`), or a Q4_K_M as llama.cpp hands them out.

usage: gguf_quantize.py IN.gguf OUT.gguf q8_0|q4_0|q4_k_m
needs: llama-cpp-python (the venv `just bench-llamacpp` makes)
"""
import ctypes
import sys

import llama_cpp

src, dst, kind = sys.argv[1], sys.argv[2], sys.argv[3]
ftypes = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
          "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}
if kind not in ftypes:
    sys.exit(f"error: {kind!r} is not one of {', '.join(ftypes)}")
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = ftypes[kind]
params.nthread = 2
if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
    sys.exit(f"error: llama.cpp could not quantize {src}")
print("wrote", dst)
