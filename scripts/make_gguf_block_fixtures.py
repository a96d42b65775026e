#!/usr/bin/env python3
"""GGUF fixtures whose projections are kept as blocks (converter/tests/gguf_blocks.rs): tiny
random Llama models written as an F32 GGUF the way llama.cpp's convert_hf_to_gguf.py writes
one (its tensor names, the q/k row permutation, `tokenizer.ggml.*` from the tiny-llama3
fixture's byte-level BPE tokenizer.json), then quantized by llama.cpp's own
`llama_model_quantize`:
- gguf-q8_0/: two layers, hidden 128, tied embeddings (no output.weight), MOSTLY_Q8_0;
- gguf-q4_0/: one layer, hidden 256, untied, MOSTLY_Q4_0 (llama.cpp makes output.weight
  Q6_K, so the file mixes a 32-value and a 256-value block type).
(Q4_K and Q6_K: tests/data/gguf-llama-bpe, made by scripts/make_gguf_fixtures.py.)

No expected logits: the test compares the imported blocks with the file's bytes, and the
runtime on the blocks with the runtime on their values.

usage: target/llamacpp/venv/bin/python scripts/make_gguf_block_fixtures.py converter/tests/data
writes: gguf-q8_0/ and gguf-q4_0/, each model.gguf and fixture.json (how it was made, the
tensor types)
needs: numpy, gguf (gguf-py), llama-cpp-python (the llama.cpp venv); no torch
"""
import json, os, sys, tempfile

import numpy as np
import gguf
import llama_cpp

sys.path.insert(0, os.path.dirname(__file__))
from gguf_llama import add_gpt2_vocab, gguf_name, permute, quantize  # noqa: E402

VOCAB = 384  # the tiny-llama3 tokenizer's


def state(rng, hidden, ffn, layers, heads, kv_heads, tied):
    """Random weights under Hugging Face names: matrices normal(0, 0.05), norms near 1."""
    head_dim = hidden // heads
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,)}
    if not tied:
        shapes["lm_head.weight"] = (VOCAB, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (ffn, hidden),
            p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
        })
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            out[name] = rng.uniform(0.5, 1.5, shape).astype(np.float32)
        else:
            out[name] = rng.normal(0.0, 0.05, shape).astype(np.float32)
    return out


def make(root, name, ftype, hidden, ffn, layers, heads, kv_heads, tied, seed):
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    tok_json = json.load(open(os.path.join(root, "tiny-llama3", "tokenizer.json")))
    weights = state(np.random.default_rng(seed), hidden, ffn, layers, heads, kv_heads, tied)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "f32.gguf")
        w = gguf.GGUFWriter(f32, "llama")
        w.add_block_count(layers)
        w.add_context_length(256)
        w.add_embedding_length(hidden)
        w.add_feed_forward_length(ffn)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_freq_base(10000.0)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_dimension_count(hidden // heads)
        w.add_vocab_size(VOCAB)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        add_gpt2_vocab(w, tok_json, VOCAB, "llama-bpe")
        merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
        w.add_token_merges(merges)
        w.add_bos_token_id(0)
        w.add_eos_token_id(1)
        w.add_add_bos_token(True)
        for hf, data in weights.items():
            if hf.endswith("q_proj.weight"):
                data = permute(data, heads)
            if hf.endswith("k_proj.weight"):
                data = permute(data, kv_heads)
            w.add_tensor(gguf_name(hf), np.ascontiguousarray(data))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        quantize(f32, os.path.join(out, "model.gguf"), ftype)
    reader = gguf.GGUFReader(os.path.join(out, "model.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    json.dump({
        "made_by": f"scripts/make_gguf_block_fixtures.py, llama-cpp-python {llama_cpp.__version__}, gguf-py, numpy {np.__version__}, seed {seed}",
        "tensor_types": types,
    }, open(os.path.join(out, "fixture.json"), "w"), indent=1)
    print(f"wrote {out}: {os.path.getsize(os.path.join(out, 'model.gguf'))} bytes, types {sorted(set(types.values()))}")


def main():
    root = sys.argv[1]
    make(root, "gguf-q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, hidden=128, ffn=256, layers=2,
         heads=4, kv_heads=2, tied=True, seed=20261124)
    make(root, "gguf-q4_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, hidden=256, ffn=512, layers=1,
         heads=4, kv_heads=2, tied=False, seed=20261125)


if __name__ == "__main__":
    main()
