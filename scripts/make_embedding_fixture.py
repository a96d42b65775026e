#!/usr/bin/env python3
"""Makes the embedding-model fixtures for converter/tests/embeddings.rs and cli/tests/serve_embeddings.rs.

usage: python3 scripts/make_embedding_fixture.py converter/tests/data

Writes two tiny random embedding checkpoints, each as sentence-transformers saves it
(the transformer's config.json, model.safetensors, tokenizer files at the root;
modules.json; 1_Pooling/config.json; 2_Normalize where listed), and embeddings.json: the
texts, their token ids, and the embeddings sentence-transformers computes for them:

- embed-llama/: a `LlamaModel` (no lm_head, tensors named without `model.`), grouped-query
  attention, q/k/v/o and MLP biases, mean pooling, then Normalize. Its tokenizer adds
  `<s>` before each text (a post-processor).
- embed-qwen3/: a `Qwen3Model` (per-head q/k norms, head_dim 24 != 64 / 4, biases on),
  last-token pooling, no Normalize, `matryoshka_dimensions` [16, 32] in config.json. Its
  tokenizer appends `<|endoftext|>` to each text, as Qwen3-Embedding's does. Besides its
  own embeddings, embeddings.json holds what sentence-transformers gives with a Normalize
  module added (`normalized`: what the runtime's default pooling, the last token
  normalized, must give once modules.json is taken away) and with `truncate_dim` d and a
  Normalize module (`truncated_normalized`, per d in 16, 32: a cut then normalized vector,
  as /v1/embeddings' `dimensions` gives on that default).

Weights are random (normal(0, 0.15) matrices), norm weights uniform(0.5, 1.5), biases
normal(0, 0.5) (transformers initialises them to 1 and 0, which would hide a dropped norm
or bias), f32. Each text is encoded alone (batch_size=1): no padding.

needs: torch, transformers, sentence-transformers, tokenizers, safetensors
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

VOCAB = 96
SPECIALS = ["<unk>", "<s>", "<|endoftext|>", "<pad>"]

# Texts of the word-level vocabulary's words (`w4` ... `w95`), 1 to 100 words.
TEXTS = [
    "w4",
    "w17 w5 w88",
    "w40 w41 w42 w43 w44 w45 w46 w47",
    "w9 w90 w12 unknown w33 w70 w71",
    " ".join(f"w{4 + (i * 37 + 11) % (VOCAB - 4)}" for i in range(100)),
    "w95 w94 w93 w92 w91 w90 w89 w88 w87 w86 w85 w84 w83 w82 w81 w80 w79 w78 w77",
]


def word_tokenizer(post):
    """A word-level tokenizer over SPECIALS and `w4` ... `w95`, whitespace-split, whose
    post-processor adds `post`'s special token (a TemplateProcessing)."""
    vocab = {name: i for i, name in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), VOCAB)})
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    single = {"bos": "<s> $A", "eos": "$A <|endoftext|>"}[post]
    token = {"bos": "<s>", "eos": "<|endoftext|>"}[post]
    tok.post_processor = tokenizers.processors.TemplateProcessing(
        single=single, special_tokens=[(token, vocab[token])])
    return tok


def randomise(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 0.15)


def save_checkpoint(model, tokenizer, directory):
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
               "bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<pad>",
               "model_max_length": model.config.max_position_embeddings},
              open(os.path.join(directory, "tokenizer_config.json"), "w"), indent=1)


def encode(st, texts):
    """sentence-transformers' embeddings of `texts`, one at a time, f32."""
    return [st.encode([t], batch_size=1, convert_to_numpy=True)[0].astype(np.float32).tolist()
            for t in texts]


def make(out, name, model, tokenizer, pooling_mode, normalize, extra=None):
    out = os.path.join(out, name)
    if os.path.exists(out):
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(model, tokenizer, tmp)
        hidden = model.config.hidden_size
        modules = [Transformer(tmp), Pooling(hidden, pooling_mode=pooling_mode)]
        if normalize:
            modules.append(Normalize())
        st = SentenceTransformer(modules=modules, device="cpu")
        st.save(out)
    os.remove(os.path.join(out, "README.md"))  # a generated model card
    if extra:
        extra(out)
    st = SentenceTransformer(out, device="cpu")
    ids = [st.tokenize([t])["input_ids"][0].tolist() for t in TEXTS]
    fixture = {
        "made_by": f"scripts/make_embedding_fixture.py, sentence-transformers {sentence_transformers.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, float32, CPU",
        "pooling": pooling_mode,
        "normalize": normalize,
        "texts": TEXTS,
        "ids": ids,
        "embeddings": encode(st, TEXTS),
    }
    return out, st, fixture


def llama(out):
    torch.manual_seed(20261129)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-5, attention_bias=True, mlp_bias=True, bos_token_id=1,
        eos_token_id=2, pad_token_id=3,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    model = transformers.LlamaModel(config).eval()
    randomise(model)
    directory, _, fixture = make(out, "embed-llama", model, word_tokenizer("bos"), "mean", True)
    json.dump(fixture, open(os.path.join(directory, "embeddings.json"), "w"), indent=1)
    print("wrote", directory)


def qwen3(out):
    torch.manual_seed(20261130)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        max_position_embeddings=128, rms_norm_eps=1e-6, attention_bias=True,
        use_sliding_window=False, bos_token_id=1, eos_token_id=2, pad_token_id=3,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = transformers.Qwen3Model(config).eval()
    randomise(model)

    def matryoshka(directory):
        path = os.path.join(directory, "config.json")
        saved = json.load(open(path))
        saved["matryoshka_dimensions"] = [16, 32]
        json.dump(saved, open(path, "w"), indent=2)

    directory, st, fixture = make(out, "embed-qwen3", model, word_tokenizer("eos"), "lasttoken",
                                  False, matryoshka)
    # The same model with a Normalize module after its pooling, whole and cut.
    normalized = SentenceTransformer(modules=[*st, Normalize()], device="cpu")
    fixture["normalized"] = encode(normalized, TEXTS)
    fixture["truncated_normalized"] = {}
    for d in (16, 32):
        normalized.truncate_dim = d
        # truncate_dim cuts after the modules; normalizing again after the cut is what a
        # Normalize module over the cut vector gives.
        cut = [np.asarray(v[:d], dtype=np.float32) for v in fixture["normalized"]]
        again = encode(normalized, TEXTS)
        assert all(np.allclose(c, a) for c, a in zip(cut, again)), "truncate_dim cuts"
        fixture["truncated_normalized"][str(d)] = [
            torch.nn.functional.normalize(torch.tensor(a), dim=0).tolist() for a in again]
    json.dump(fixture, open(os.path.join(directory, "embeddings.json"), "w"), indent=1)
    print("wrote", directory)


if __name__ == "__main__":
    root = sys.argv[1]
    llama(root)
    qwen3(root)
