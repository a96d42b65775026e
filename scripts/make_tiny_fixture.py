#!/usr/bin/env python3
"""Makes the tiny-model fixture for converter/tests/tiny_logits.rs and the context-limit tests.

A randomly initialised 2-layer Llama (grouped-query attention, untied lm_head, unusual
rope_theta, norm weights randomised so a dropped norm shows) saved as an f32 Hugging Face
checkpoint, a word-level tokenizer for its 96 tokens (`t1` ... `t95`, `<unk>` at 0; made
with the `tokenizers` library, so runtime tests can pass text), and the logits transformers
computes for a fixed sequence of 100 token ids: long enough that a decoded token's attention
splits its keys across 5 threads. The Rust test converts the checkpoint, runs it with the
runtime and compares logits: the forward pass is checked against the reference, not
against itself.

usage: python3 scripts/make_tiny_fixture.py converter/tests/data/tiny
needs: torch, transformers, tokenizers (the oracle venv from ../shared/tools/setup-oracle.sh)
"""
import json, os, sys

import tokenizers
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
torch.manual_seed(20261122)
config = LlamaConfig(
    vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    rms_norm_eps=1e-5, rope_theta=500.0, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, torch_dtype="float32",
)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():  # default init is tiny; widen it so attention patterns matter
    for p in model.parameters():
        if p.dim() == 2:
            p.normal_(0.0, 0.15)
        else:
            p.uniform_(0.5, 1.5)
model.save_pretrained(out, safe_serialization=True)

vocab = {"<unk>": 0, **{f"t{i}": i for i in range(1, config.vocab_size)}}
tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
tokenizer.save(os.path.join(out, "tokenizer.json"))

ids = [(i * 37 + 11) % config.vocab_size for i in range(100)]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
json.dump({
    "made_by": f"scripts/make_tiny_fixture.py, transformers {transformers.__version__}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, float32, CPU",
    "ids": ids,
    "logits": [[round(float(v), 7) for v in row] for row in logits],
}, open(os.path.join(out, "logits.json"), "w"))
print("wrote", out)
