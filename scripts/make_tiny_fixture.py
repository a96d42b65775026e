#!/usr/bin/env python3
"""Makes the tiny-model fixtures for converter/tests/tiny_logits.rs and the context-limit tests.

usage: python3 scripts/make_tiny_fixture.py converter/tests/data/tiny
       python3 scripts/make_tiny_fixture.py --family converter/tests/data [VARIANT ...]

The first form writes `tiny` (below); the second the Llama-family variants (see `variants()` at
the end of this file), each in converter/tests/data/tiny-VARIANT.

A randomly initialised 2-layer Llama (grouped-query attention, untied lm_head, unusual
rope_theta, norm weights randomised so a dropped norm shows) saved as an f32 Hugging Face
checkpoint, a word-level tokenizer for its 96 tokens (`t1` ... `t95`, `<unk>` at 0; made
with the `tokenizers` library, so runtime tests can pass text), and the logits transformers
computes for a fixed sequence of 100 token ids: long enough that a decoded token's attention
splits its keys across 5 threads. The Rust test converts the checkpoint, runs it with the
runtime and compares logits: the forward pass is checked against the reference, not
against itself.

needs: torch, transformers, tokenizers (the oracle venv from ../shared/tools/setup-oracle.sh)
"""
import json, os, sys

import tokenizers
try:
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError:  # make_random_checkpoint.py needs only the tokenizer helpers below
    torch = transformers = LlamaConfig = LlamaForCausalLM = None



def make_tiny(out):
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


# ---------------------------------------------------------------------------------------
# The Llama family: one tiny random checkpoint per variant, each switching on what a real
# model family uses. Weights are rounded to bf16 and saved as bf16 (as published models
# are); the logits are computed in f32 from those bf16 values (bf16 -> f32 is exact), which
# is what the runtime computes. Biases and norm weights are randomised (transformers
# initialises them to 0 and 1, so a dropped bias or norm would still pass), and for each
# variant the script checks that switching its feature off moves the logits far more than
# the tests' 1e-4 tolerance: the fixture can catch a runtime that ignores the feature.

# Llama 3's and Qwen2's pre-tokenizer splits (their tokenizer.json `Split` patterns; GGUF's
# `llama-bpe` and `qwen2`). They differ in digits: up to three at once, or one.
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

TRAINING_TEXT = """The quick brown fox jumps over the lazy dog. Llamas live in the Andes, at 3,800 metres;
they carry 25 to 30 percent of their weight. Mistral is a cold wind that blows from the north
through the Rhone valley in 1,024 gusts. Qwen asked: "What's 12 + 7?" and we'll answer 19.
def attention(q, k, v):\n    return softmax(q @ k.T / 8.0) @ v\n
Tokenizers split text into pieces; byte-level BPE merges frequent pairs of bytes.""" * 3

SEQUENCE_TEXT = """In 2026 the weather over the valley changed: 17 days of rain, then sun. She said, "It's
fine, we'll walk the 4.5 km to the lake." The model's answer was 42, or maybe 1,337! Code:
for i in range(10): print(i ** 2)  # squares"""

SEQUENCE_LENGTH = 100


def bpe_tokenizer(split, specials, vocab_size):
    """A byte-level BPE tokenizer as Llama 3's and Qwen2's tokenizer.json are built: a regex
    Split then ByteLevel without its own regex, trained on TRAINING_TEXT."""
    from tokenizers import Regex, decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAINING_TEXT], trainer)
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
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def logits_of(model_class, config, state, ids, edit_model=None):
    model = model_class(config).eval()
    model.load_state_dict(state)
    if edit_model:
        edit_model(model)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def make_variant(out, name, family, config_args, tokenizer, switched_off, edit_config=None):
    """Writes one variant; `switched_off` maps a feature name to config changes that turn it
    off (or "zero_biases"), each checked to move the logits by more than 1e-2."""
    import transformers as tf
    model_class, config_class = {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config),
        "qwen3": (tf.Qwen3ForCausalLM, tf.Qwen3Config),
        "smollm3": (tf.SmolLM3ForCausalLM, tf.SmolLM3Config),
        "gemma3": (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig),
        "phi3": (tf.Phi3ForCausalLM, tf.Phi3Config),
    }[family]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(20261123)
    config = config_class(**config_args)
    model = model_class(config).eval()
    randomise(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = tokenizer.encode(SEQUENCE_TEXT).ids[:SEQUENCE_LENGTH]
    assert len(ids) == SEQUENCE_LENGTH, len(ids)
    logits = logits_of(model_class, config, state, ids)
    effects = {}
    for feature, change in switched_off.items():
        if change == "zero_biases":
            off_state = {k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in state.items()}
            off = logits_of(model_class, config, off_state, ids)
        elif callable(change):  # an edit of the loaded model
            off = logits_of(model_class, config, state, ids, change)
        else:
            off = logits_of(model_class, config_class(**{**config_args, **change}), state, ids)
        effects[feature] = float((off - logits).abs().max())
        assert effects[feature] > 1e-2, f"{name}: {feature} off changes logits by only {effects[feature]}"
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    if edit_config:  # as the hub's files write it, not as transformers 5 saves it
        path = os.path.join(out, "config.json")
        saved = json.load(open(path))
        edit_config(saved)
        json.dump(saved, open(path, "w"), indent=2)
        # transformers reads the edited file as the same model.
        reread = config_class.from_pretrained(out)
        again = logits_of(model_class, reread, state, ids)
        assert torch.equal(again, logits), f"{name}: the edited config.json reads differently"
    tokenizer.save(os.path.join(out, "tokenizer.json"))
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))
    json.dump({
        "made_by": f"scripts/make_tiny_fixture.py --family, transformers {transformers.__version__}, torch {torch.__version__}, tokenizers {tokenizers.__version__}, bf16 weights, f32 logits, CPU",
        "ids": ids,
        "vocab_size": config.vocab_size,
        "feature_off_max_logit_change": effects,
    }, open(os.path.join(out, "fixture.json"), "w"), indent=1)
    print(f"wrote {out}: feature off moves logits by {effects}")


def hub_rope_scaling(config):
    """transformers 5 saves `rope_parameters`; the hub's Llama 3.x files have `rope_scaling`
    and a top-level `rope_theta`."""
    parameters = config.pop("rope_parameters")
    config["rope_theta"] = parameters.pop("rope_theta")
    config["rope_scaling"] = parameters


def old_style_type(config):
    """Older files: `rope_scaling` with `type` instead of `rope_type`."""
    hub_rope_scaling(config)
    config["rope_scaling"]["type"] = config["rope_scaling"].pop("rope_type")


def qwen2_hub_window(config):
    """Qwen2.5's hub files keep a `sliding_window` that `use_sliding_window: false` turns
    off, and no `layer_types`."""
    config["sliding_window"] = 16
    config["max_window_layers"] = 1
    del config["layer_types"]


def without_qk_norm(model):
    """Qwen3 with its per-head query and key norms taken out."""
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()


def without_sandwich_norms(model):
    """Gemma 3 without the norms on the attention's and the MLP's outputs."""
    for layer in model.model.layers:
        layer.post_attention_layernorm = torch.nn.Identity()
        layer.post_feedforward_layernorm = torch.nn.Identity()


def without_embedding_scale(model):
    model.model.embed_tokens.embed_scale.fill_(1.0)


def without_unit_offset(model):
    """Gemma's norms multiplying by w, as a runtime that ignored the offset would."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p -= 1.0


def gemma3_hub_layout(config):
    """Gemma 3's hub files: `rope_theta`, `rope_local_base_freq`, `rope_scaling` for the
    global layers and `sliding_window_pattern` instead of `layer_types`."""
    parameters = config.pop("rope_parameters")
    config["rope_theta"] = parameters["full_attention"].pop("rope_theta")
    config["rope_local_base_freq"] = parameters["sliding_attention"]["rope_theta"]
    config["rope_scaling"] = parameters["full_attention"]
    config["sliding_window_pattern"] = 3
    del config["layer_types"]
    config.pop("_sliding_window_pattern", None)  # transformers' private copy


def variants():
    llama_tok = bpe_tokenizer(LLAMA3_SPLIT, ["<|begin_of_text|>", "<|end_of_text|>"], 360)
    qwen_tok = bpe_tokenizer(QWEN2_SPLIT, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 360)
    base = dict(vocab_size=384, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                max_position_embeddings=256, rms_norm_eps=1e-5, bos_token_id=0, eos_token_id=1)
    llama3_rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 32}
    return {
        # Llama 3.x: llama3 RoPE scaling, head_dim 24 (q is 96 wide, hidden 64), q/k/v/o
        # and MLP biases, tied embeddings; config.json as the hub writes it.
        "llama3": ("llama", dict(base, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                 attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                                 rope_parameters=llama3_rope),
                   llama_tok,
                   {"rope_scaling": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
                    "biases": "zero_biases"},
                   hub_rope_scaling),
        # Linear RoPE scaling (an older file's `type` key), multi-head attention, untied.
        "linear": ("llama", dict(base, num_attention_heads=4, num_key_value_heads=4,
                                 tie_word_embeddings=False,
                                 rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
                   llama_tok,
                   {"rope_scaling": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}},
                   old_style_type),
        # Mistral: a sliding window of 24 over the 100 positions, multi-query attention.
        "mistral": ("mistral", dict(base, num_attention_heads=4, num_key_value_heads=1,
                                    sliding_window=24, tie_word_embeddings=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                    llama_tok,
                    {"sliding_window": {"sliding_window": None}},
                    None),
        # Qwen2: q/k/v biases (o none), tied, theta 1e6, a `sliding_window` of 16 that
        # `use_sliding_window: false` turns off (a runtime applying it fails).
        "qwen2": ("qwen2", dict(base, num_attention_heads=4, num_key_value_heads=2,
                                tie_word_embeddings=True, use_sliding_window=False,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                  qwen_tok,
                  {"biases": "zero_biases"},
                  qwen2_hub_window),
        # Qwen2.5 with YaRN (as its model cards describe for long context): factor 4 over an
        # original context of 32.
        "yarn": ("qwen2", dict(base, num_attention_heads=4, num_key_value_heads=2,
                               tie_word_embeddings=False, max_position_embeddings=128,
                               rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                                "original_max_position_embeddings": 32}),
                 qwen_tok,
                 {"rope_scaling": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}},
                 None),
        # Qwen3: each query and key head RMS-normalized before RoPE, head_dim 24 (q is 96
        # wide, hidden 64), q/k/v/o biases switched on (`attention_bias`; the published
        # models have none), tied, theta 1e6, as transformers 5 saves it (`layer_types`).
        "qwen3": ("qwen3", dict(base, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                attention_bias=True, tie_word_embeddings=True,
                                use_sliding_window=False,
                                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
                  qwen_tok,
                  {"qk_norm": without_qk_norm, "biases": "zero_biases"},
                  None),
        # SmolLM3: no RoPE in every fourth layer (3 and 7 of 8), q/k/v/o and MLP biases on
        # (the published model has none), tied, theta 5e6.
        "smollm3": ("smollm3", dict(base, num_hidden_layers=8, num_attention_heads=4, pad_token_id=None,
                                    num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                    tie_word_embeddings=True, use_sliding_window=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 5000000.0}),
                    llama_tok,
                    {"no_rope": {"no_rope_layers": [1] * 8}, "biases": "zero_biases"},
                    None),
        # Gemma 3 (text): six layers, sliding (window 24 of the 100 positions) twice then
        # global, each kind with its RoPE base (the global one linearly scaled, as Gemma 3
        # 4B+ are), q/k norms, sandwich norms, embeddings scaled by sqrt(hidden), GELU-tanh,
        # norm weights as offsets from 1, scores scaled by query_pre_attn_scalar 64 (not
        # head_dim 24's), q/k/v/o biases on (the published models have none), tied;
        # config.json as the hub writes it.
        "gemma3": ("gemma3", dict(base, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=24, attention_bias=True, tie_word_embeddings=True,
                                  sliding_window=24, query_pre_attn_scalar=64, pad_token_id=0,
                                  hidden_activation="gelu_pytorch_tanh",
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                                  rope_parameters={
                                      "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}),
                   llama_tok,
                   {"sliding_window": {"sliding_window": 512},
                    "sliding_rope_base": {"rope_parameters": {
                        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0},
                        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100000.0}}},
                    "global_rope_scaling": {"rope_parameters": {
                        "full_attention": {"rope_type": "default", "rope_theta": 100000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}},
                    "qk_norm": without_qk_norm, "sandwich_norms": without_sandwich_norms,
                    "embedding_scale": without_embedding_scale, "unit_offset_norms": without_unit_offset,
                    "gelu_tanh": {"hidden_activation": "silu"}, "query_pre_attn_scalar": {"query_pre_attn_scalar": 24},
                    "biases": "zero_biases"},
                   gemma3_hub_layout),
        # Phi-3: q/k/v and gate/up each one fused projection, a sliding window of 24 over
        # every layer (Phi-3-mini's is 2047), untied.
        "phi3": ("phi3", dict(base, num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
                              sliding_window=24, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
                 llama_tok,
                 {"sliding_window": {"sliding_window": None}},
                 None),
    }


if __name__ == "__main__":
    if sys.argv[1] == "--family":
        root, wanted = sys.argv[2], sys.argv[3:]
        for name, (family, args, tok, off, edit) in variants().items():
            if not wanted or name in wanted:
                make_variant(os.path.join(root, f"tiny-{name}"), name, family, args, tok, off, edit)
    else:
        make_tiny(sys.argv[1])
