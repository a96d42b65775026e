#!/usr/bin/env python3
"""GGUF fixtures written by llama.cpp's own converter, for converter/tests/tiny_logits.rs
(`gguf_family_imports_match_transformers`): Gemma 3 (`gemma3`), Phi-3 (`phi3`) and SmolLM3
(`smollm3`).

For each: a tiny random transformers model (norms and biases random, weights rounded to
bf16; see make_tiny_fixture.py's `randomise`) is saved as a Hugging Face checkpoint with a
byte-level BPE tokenizer.json (Llama 3's pre-tokenizer split), converted by llama.cpp's
convert_hf_to_gguf.py with `--outtype f32` (run as is, from the llama.cpp sources given
below; the one change: `get_vocab_base_pre`, which names the pre-tokenizer from a hash of
a known tokenizer's output, returns `llama-bpe`, since this tokenizer is not a published
one), and transformers' logits of the checkpoint on the fixture's 100 ids are recorded.
Each architecture feature the import must carry over is checked to move transformers'
logits by more than 1e-2 when switched off, llama.cpp's tokenization of the GGUF is checked
to equal the tokenizer's on the tokenizer oracle's strings, and llama.cpp's own logits of
the GGUF (with an f32 KV cache) are checked to be transformers' as llama.cpp computes the
model: SmolLM3 as is, within 1e-3; Phi-3 without its window (which llama.cpp disables),
within 1e-3; Gemma 3 with ggml's fp16-table GELU, within 2e-2.

- gemma3: 12 layers (the GGUF cannot say the sliding-window pattern, llama.cpp assumes 6:
  layers 5 and 11 global), a window of 24 of the 100 positions, sliding layers' RoPE base
  10000 (llama.cpp's assumption), the global layers' 100000 linearly scaled by 2, q/k norms,
  sandwich norms, norm weights as offsets from 1 (w in [-0.5, 0.5]; the GGUF holds 1 + w),
  head_dim 24 ≠ hidden 48 / 4 heads, query_pre_attn_scalar = head_dim (llama.cpp's scale),
  GELU-tanh, tied embeddings;
- phi3: 2 layers, q/k/v and gate/up fused, a sliding window of 24 (kept in config.json:
  transformers applies it), untied;
- smollm3: 8 layers, no RoPE in layers 3 and 7 (llama.cpp's fixed step 4), q/k rows
  permuted by the converter (a LlamaModel), tied.

usage: ~/.cache/oracle-venv/bin/python scripts/make_gguf_fixtures_llamacpp.py converter/tests/data [NAME...]
writes: gguf-gemma3/, gguf-phi3/, gguf-smollm3/ (or the NAMEs given), each model.gguf (F32),
tokenizer.json (the source tokenizer), fixture.json (ids, effect sizes, how it was made)
and logits.bin ([ids, vocab] f32 LE)
needs: torch, transformers, tokenizers, llama-cpp-python (the oracle venv); llama.cpp's
sources (LLAMA_CPP, default the llama-cpp-python 0.3.36 sdist's vendor/llama.cpp)
"""
import json, os, subprocess, sys, tempfile

import torch
import tokenizers
import transformers
import llama_cpp

sys.path.insert(0, os.path.dirname(__file__))
from make_tiny_fixture import (  # noqa: E402
    LLAMA3_SPLIT, SEQUENCE_LENGTH, SEQUENCE_TEXT, bpe_tokenizer, logits_of, randomise,
    without_embedding_scale, without_qk_norm, without_sandwich_norms, without_unit_offset,
)
from make_gguf_fixtures import ORACLE, check_llama_cpp_tokenizes_alike  # noqa: E402

from llamacpp_convert import convert  # noqa: E402


def llama_cpp_logits(path, ids):
    # An f32 KV cache (llama.cpp's default is f16), so the logits are comparable.
    llm = llama_cpp.Llama(path, n_ctx=256, n_batch=256, logits_all=True, verbose=False,
                          type_k=0, type_v=0, flash_attn=False)
    llm.eval(ids)
    return torch.tensor(llm.scores[: len(ids)])


def ggml_gelu(model):
    """GELU as ggml's CPU backend computes it (`GGML_GELU_FP16`): a table of fp16 values
    looked up by the input rounded to fp16, the identity from 10 up, 0 from -10 down."""
    class Gelu(torch.nn.Module):
        def forward(self, x):
            table = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
            return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, table))
    for layer in model.model.layers:
        layer.mlp.act_fn = Gelu()


def gemma_norm_offsets(model):
    """Gemma's norm weights as offsets from 1: w uniform in [-0.5, 0.5], so 1 + w (what the
    GGUF holds) is in [0.5, 1.5]. `randomise`'s [0.5, 1.5] for w would make every norm
    multiply by 1.5 to 2.5, and the 12 layers so ill-conditioned that transformers' own f32
    logits differ from its f64 ones by 3e-4 (5e-6 with these)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
                p.copy_(p.to(torch.bfloat16).to(torch.float32))


def make(out_root, name, family, config_args, switched_off, tokenizer_class, as_llama_cpp=None):
    import transformers as tf
    model_class, config_class = {
        "smollm3": (tf.SmolLM3ForCausalLM, tf.SmolLM3Config),
        "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig),
        "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config),
    }[family]
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok = bpe_tokenizer(LLAMA3_SPLIT, specials, 360)
    # The embedding as many rows as the tokenizer has tokens: Gemma 3's converter drops
    # rows past the tokenizer's.
    config_args = dict(config_args, vocab_size=tok.get_vocab_size())
    torch.manual_seed(20261124)
    config = config_class(**config_args)
    model = model_class(config).eval()
    randomise(model)
    if family == "gemma3":
        gemma_norm_offsets(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = tok.encode(SEQUENCE_TEXT).ids[:SEQUENCE_LENGTH]
    assert len(ids) == SEQUENCE_LENGTH, len(ids)
    logits = logits_of(model_class, config, state, ids)
    # Well-conditioned enough for the tests' 1e-4: transformers' f32 logits within 2e-5 of
    # its f64 ones.
    with torch.no_grad():
        f64 = model_class(config).eval().double()
        f64.load_state_dict(state)
        f64_diff = float((f64(torch.tensor([ids])).logits[0] - logits).abs().max())
    assert f64_diff < 2e-5, f"{name}: f32 logits differ from f64 ones by {f64_diff}"
    effects = {}
    for feature, change in switched_off.items():
        if callable(change):
            off = logits_of(model_class, config, state, ids, change)
        else:
            off = logits_of(model_class, config_class(**{**config_args, **change}), state, ids)
        effects[feature] = round(float((off - logits).abs().max()), 4)
        assert effects[feature] > 1e-2, f"{name}: {feature} off changes logits by only {effects[feature]}"
    strings = json.load(open(ORACLE))["cases"] if os.path.exists(ORACLE) else []
    strings = [c["text"] if isinstance(c, dict) else c for c in strings]
    with tempfile.TemporaryDirectory() as hf:
        model.save_pretrained(hf, safe_serialization=True)
        tok.save(os.path.join(hf, "tokenizer.json"))
        json.dump({"tokenizer_class": tokenizer_class, "bos_token": specials[0],
                   "eos_token": specials[1], "add_bos_token": False},
                  open(os.path.join(hf, "tokenizer_config.json"), "w"))
        gguf_path = os.path.join(out, "model.gguf")
        # A name without the family's: llama.cpp looks up tokens Phi-3's vocabulary has by name.
        convert(hf, gguf_path)
    check_llama_cpp_tokenizes_alike(gguf_path, tok, [SEQUENCE_TEXT] + strings)
    theirs = llama_cpp_logits(gguf_path, ids)
    # The model as llama.cpp computes it (Gemma's GELU; Phi-3 without its window).
    if callable(as_llama_cpp):
        like_llama_cpp = logits_of(model_class, config, state, ids, as_llama_cpp)
    elif as_llama_cpp:
        like_llama_cpp = logits_of(model_class, config_class(**{**config_args, **as_llama_cpp}), state, ids)
    else:
        like_llama_cpp = logits
    llama_cpp_diff = float((theirs - like_llama_cpp).abs().max())
    # The GGUF is the checkpoint, as llama.cpp reads it. Gemma's table GELU leaves
    # differences of a few 1e-3 after 12 layers (position 0: 3e-6); a window one position
    # off, say, moves them by 1 or more.
    tolerance = 2e-2 if family == "gemma3" else 1e-3
    assert llama_cpp_diff < tolerance, f"{name}: llama.cpp's logits differ by {llama_cpp_diff}"
    tok.save(os.path.join(out, "tokenizer.json"))
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))
    json.dump({
        "made_by": f"scripts/make_gguf_fixtures_llamacpp.py, llama.cpp's convert_hf_to_gguf.py (llama-cpp-python {llama_cpp.__version__}'s) --outtype f32, transformers {transformers.__version__}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, bf16-valued weights, f32 logits, CPU",
        "ids": ids,
        "vocab_size": config.vocab_size,
        "feature_off_max_logit_change": effects,
        "llama_cpp_max_logit_difference": round(llama_cpp_diff, 6),
        "f64_max_logit_difference": f64_diff,
        "tokenizer_strings_checked_with_llama_cpp": 1 + len(strings),
    }, open(os.path.join(out, "fixture.json"), "w"), indent=1)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({size} bytes): feature off moves logits by {effects}; "
          f"llama.cpp's logits differ from transformers' by {llama_cpp_diff:.2e}")


def variants():
    base = dict(max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1)
    gemma_rope = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    gemma_layers = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    return {
        "gguf-gemma3": ("gemma3", dict(
            base, hidden_size=48, intermediate_size=64, num_hidden_layers=12,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=24,
            tie_word_embeddings=True, sliding_window=24, pad_token_id=0,
            hidden_activation="gelu_pytorch_tanh", layer_types=gemma_layers,
            rope_parameters=gemma_rope), {
            "sliding_window": {"sliding_window": 512},
            "global_layers": {"layer_types": ["sliding_attention"] * 12},
            "sliding_rope_base": {"rope_parameters": {
                "full_attention": gemma_rope["full_attention"],
                "sliding_attention": {"rope_type": "default", "rope_theta": 100000.0}}},
            "global_rope_scaling": {"rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                "sliding_attention": gemma_rope["sliding_attention"]}},
            "qk_norm": without_qk_norm, "sandwich_norms": without_sandwich_norms,
            "embedding_scale": without_embedding_scale, "unit_offset_norms": without_unit_offset,
            "gelu_tanh": {"hidden_activation": "silu"},
            "query_pre_attn_scalar": {"query_pre_attn_scalar": 256}}, "PreTrainedTokenizerFast",
            ggml_gelu),
        # Phi-3's converter reads GPT2Tokenizer's vocabulary (Phi-4's) through
        # `_set_vocab_gpt2`; else a SentencePiece tokenizer.model.
        "gguf-phi3": ("phi3", dict(
            base, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, sliding_window=24,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}), {
            "sliding_window": {"sliding_window": None}}, "GPT2Tokenizer",
            {"sliding_window": None}),
        "gguf-smollm3": ("smollm3", dict(
            base, hidden_size=64, intermediate_size=112, num_hidden_layers=8,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=None,
            tie_word_embeddings=True, use_sliding_window=False,
            rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}), {
            "no_rope": {"no_rope_layers": [1] * 8}}, "PreTrainedTokenizerFast"),
    }


def main():
    root, wanted = sys.argv[1], sys.argv[2:]
    for name, args in variants().items():
        if not wanted or name in wanted:
            make(root, name, *args)


if __name__ == "__main__":
    main()
