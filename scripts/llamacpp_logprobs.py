#!/usr/bin/env python3
"""llama.cpp's log-probabilities at every position of a text, for `runtime perplexity
--kl-base`: the ids are read from a file `runtime perplexity --save-logprobs` wrote (so both
score the same tokens), evaluated by llama-cpp-python over a GGUF, and written in the same
format (cli/src/logprobs.rs): `LOGPROBS`, positions and vocabulary (u32), the ids (u32),
then a row of log-softmax values (f32) per position.

usage: llamacpp_logprobs.py MODEL.gguf IDS_FROM.bin OUT.bin [THREADS] [--top K]

With `--top K`, OUT is instead the test data runtime/tests/int8.rs compares with: JSON with
the ids, each prediction's negative log-likelihood, and each position's K most likely ids
and their log-probabilities.

Weight repacking is off (`use_extra_bufts`): llama-cpp-python 0.3.36 crashes in a prompt
over a quantized GGUF on CPUs with AMX (ggml-org/llama.cpp#20824); the products are the same
ones (activations rounded to ggml's Q8_0 / Q8_K blocks, integer dot products).
"""
import json
import struct
import sys

import numpy as np
import llama_cpp.llama_cpp as llama_cpp_lib
from llama_cpp import Llama

args = sys.argv[1:]
top_k = None
if "--top" in args:
    at = args.index("--top")
    top_k = int(args[at + 1])
    del args[at:at + 2]
model, ids_from, out = args[0], args[1], args[2]
threads = int(args[3]) if len(args) > 3 else 2

with open(ids_from, "rb") as f:
    assert f.read(8) == b"LOGPROBS", f"{ids_from} is not a log-probabilities file"
    positions, vocab = struct.unpack("<II", f.read(8))
    ids = list(struct.unpack(f"<{positions}I", f.read(4 * positions)))

default = llama_cpp_lib.llama_model_default_params


def without_repacking():
    p = default()
    p.use_extra_bufts = False
    return p


llama_cpp_lib.llama_model_default_params = without_repacking
llm = Llama(model_path=model, n_ctx=positions + 8, n_batch=512, n_threads=threads,
            n_threads_batch=threads, logits_all=True, verbose=False)
llm.eval(ids)
logits = np.asarray(llm.scores[:positions], dtype=np.float64)
assert logits.shape[1] == vocab, f"llama.cpp's vocabulary is {logits.shape[1]}, ours {vocab}"
top = logits.max(axis=1, keepdims=True)
logprobs = logits - (top + np.log(np.exp(logits - top).sum(axis=1, keepdims=True)))
nlls = [-logprobs[i, ids[i + 1]] for i in range(positions - 1)]
nll = np.mean(nlls)
if top_k is None:
    with open(out, "wb") as f:
        f.write(b"LOGPROBS" + struct.pack("<II", positions, vocab))
        f.write(struct.pack(f"<{positions}I", *ids))
        f.write(logprobs.astype("<f4").tobytes())
else:
    top = np.argsort(-logprobs, axis=1)[:, :top_k]
    import llama_cpp
    golden = {
        "made_by": f"scripts/llamacpp_logprobs.py, llama-cpp-python {llama_cpp.__version__}, "
                   f"repacking off, {threads} threads, on {model.split('/')[-1]}",
        "ids": ids,
        "nll": [round(float(x), 6) for x in nlls],
        "top_ids": top.tolist(),
        "top_logprobs": [[round(float(logprobs[i, j]), 6) for j in row]
                         for i, row in enumerate(top)],
    }
    with open(out, "w") as f:
        json.dump(golden, f, separators=(",", ":"))
print(f"llama.cpp: tokens {positions} | mean nll {nll:.6f} | perplexity {np.exp(nll):.4f}")
