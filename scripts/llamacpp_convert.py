#!/usr/bin/env python3
"""Converts a Hugging Face checkpoint to GGUF with llama.cpp's own convert_hf_to_gguf.py, run
as its `__main__` runs it with the vendored gguf-py; one change: `get_vocab_base_pre`, which
names the pre-tokenizer from a hash of a published tokenizer's output, returns `llama-bpe`
(the byte-level BPE tokenizers our scripts train split text as Llama 3's does, and are no
published tokenizer). For fixtures (scripts/make_gguf_fixtures_llamacpp.py) and for the
GGUFs llama.cpp is measured on beside us (docs/BENCHMARKS.md).

usage: python3 scripts/llamacpp_convert.py HF_DIR OUT.gguf [--outtype f32|bf16]
needs: torch, sentencepiece (the oracle venv); llama.cpp's sources (LLAMA_CPP, default the
llama-cpp-python 0.3.36 source package's vendor/llama.cpp, unpacked under /tmp/lcpp-src)
"""
import os, subprocess, sys

LLAMA_CPP = os.environ.get(
    "LLAMA_CPP", "/tmp/lcpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp")

RUN = """
import sys
sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "llama-bpe"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
"""


def convert(hf_dir, out, outtype="f32", name="tiny-random"):
    """Writes `out`. A fixed `--model-name` keeps the file the same run after run (and one
    naming "phi3" trips llama.cpp's vocabulary loader)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(LLAMA_CPP, "gguf-py"))
    subprocess.run([sys.executable, "-c", RUN, LLAMA_CPP, hf_dir, "--outtype", outtype,
                    "--model-name", name, "--outfile", out], check=True, env=env)


if __name__ == "__main__":
    outtype = sys.argv[sys.argv.index("--outtype") + 1] if "--outtype" in sys.argv else "f32"
    convert(sys.argv[1], sys.argv[2], outtype)
