#!/usr/bin/env python3
"""Writes a random bf16 checkpoint shaped like a real model, for measuring conversion and
loading at scale (not committed, not in CI: a 1B-shaped one is 2.5 GB).

usage: python3 scripts/make_random_checkpoint.py OUT_DIR [--shape SHAPE]
SHAPE: llama-3.2-1b (default), llama-3.2-3b, qwen3-0.6b, gemma-3-1b, or qwen3-0.6b-as-llama
and gemma-3-1b-as-llama (the same sizes as a Llama: no head norms, sandwich norms, sliding
window or GELU, for comparing the two)

Shapes are the published configs' (hidden, layers, heads, MLP, vocab, tied embeddings,
Llama 3.1 RoPE scaling); weights are normal(0, 0.02), norm weights normal(1, 0.1), written
tensor by tensor so the script itself needs little memory. The tokenizer is the Llama 3
style byte-level BPE that scripts/make_tiny_fixture.py trains, padded to the vocabulary
with `<|reserved_special_token_N|>` entries as Llama 3's own is, so every id decodes.

needs: numpy, tokenizers (the oracle venv from ../shared/tools/setup-oracle.sh)
"""
import json, os, struct, sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from make_tiny_fixture import LLAMA3_SPLIT, bpe_tokenizer  # noqa: E402

SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=8192, head_dim=64),
    "llama-3.2-3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                         num_key_value_heads=8, intermediate_size=8192, head_dim=128),
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, intermediate_size=3072, head_dim=128,
                       vocab_size=151936),
}
SHAPES["gemma-3-1b"] = dict(hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
                            num_key_value_heads=1, intermediate_size=6912, head_dim=256,
                            vocab_size=262144)
SHAPES["qwen3-0.6b-as-llama"] = SHAPES["qwen3-0.6b"]
SHAPES["gemma-3-1b-as-llama"] = SHAPES["gemma-3-1b"]
VOCAB = 128256


def bf16_bytes(values):
    """float32 → bf16 bits, rounded to nearest even, little-endian."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype("<u2").tobytes()


def tensors(config):
    h, f = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    yield "model.embed_tokens.weight", (config["vocab_size"], h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        if config["model_type"] in ("qwen3", "gemma3_text"):
            yield p + "self_attn.q_norm.weight", (config["head_dim"],)
            yield p + "self_attn.k_norm.weight", (config["head_dim"],)
        if config["model_type"] == "gemma3_text":
            yield p + "pre_feedforward_layernorm.weight", (h,)
            yield p + "post_feedforward_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (f, h)
        yield p + "mlp.up_proj.weight", (f, h)
        yield p + "mlp.down_proj.weight", (h, f)
    yield "model.norm.weight", (h,)


def main():
    out = sys.argv[1]
    shape = sys.argv[sys.argv.index("--shape") + 1] if "--shape" in sys.argv else "llama-3.2-1b"
    config = dict(SHAPES[shape])
    os.makedirs(out, exist_ok=True)
    config.setdefault("vocab_size", VOCAB)
    config.update({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "mlp_bias": False, "bos_token_id": 128000, "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    })
    if shape.startswith("qwen3"):  # Qwen3-0.6B's RoPE and ids
        del config["rope_scaling"]
        config.update({"rope_theta": 1000000.0, "max_position_embeddings": 40960,
                       "rms_norm_eps": 1e-6, "bos_token_id": 151643, "eos_token_id": 151645})
    if shape == "qwen3-0.6b":
        config.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                       "use_sliding_window": False})
    if shape.startswith("gemma-3"):  # Gemma 3 1B's RoPE and ids
        del config["rope_scaling"]
        config.update({"rope_theta": 1000000.0, "max_position_embeddings": 32768,
                       "rms_norm_eps": 1e-6, "bos_token_id": 2, "eos_token_id": 1})
    if shape == "gemma-3-1b":
        del config["hidden_act"]
        config.update({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                       "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                       "rope_local_base_freq": 10000.0, "sliding_window": 512,
                       "sliding_window_pattern": 6, "final_logit_softcapping": None,
                       "attn_logit_softcapping": None})
    json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)

    tok = bpe_tokenizer(LLAMA3_SPLIT, [], 360)
    base = tok.get_vocab_size()
    tok.add_special_tokens([f"<|reserved_special_token_{i}|>" for i in range(config["vocab_size"] - base)])
    tok.save(os.path.join(out, "tokenizer.json"))
    # Read as the plain tokenizer it is (transformers would otherwise pick the family's own
    # class, which adds its special tokens: llama.cpp's converter reads it through that).
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast"},
              open(os.path.join(out, "tokenizer_config.json"), "w"))

    layout = list(tensors(config))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dims in layout:
        size = int(np.prod(dims)) * 2
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + size]}
        offset += size
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    rng = np.random.default_rng(20261123)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for name, dims in layout:
            rows = dims[0]
            step = max(1, (1 << 24) // int(np.prod(dims[1:], dtype=np.int64)))
            for first in range(0, rows, step):
                part = (min(step, rows - first),) + tuple(dims[1:])
                if name.endswith("norm.weight"):
                    # Gemma's norm weights are offsets from 1.
                    mean = 0.0 if config["model_type"] == "gemma3_text" else 1.0
                    values = rng.normal(mean, 0.1, part)
                else:
                    values = rng.normal(0.0, 0.02, part)
                f.write(bf16_bytes(values))
    print(f"wrote {out}: {shape}, {offset / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
