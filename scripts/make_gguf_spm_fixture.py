#!/usr/bin/env python3
"""A GGUF with a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`), written by
llama.cpp's own converter, for converter/tests/gguf_spm.rs.

A SentencePiece BPE model (the sentencepiece library; vocab 640, byte_fallback, character
coverage 0.995 so rare characters are left to the `<0xXX>` tokens) is trained on
make_tiny_fixture.py's TRAINING_TEXT plus text with digits, punctuation, accents, CJK and
emoji; a tiny random LlamaForCausalLM (2 layers, hidden 64, tied, weights rounded to bf16)
is saved with it as tokenizer.model and converted by llama.cpp's convert_hf_to_gguf.py
(scripts/llamacpp_convert.py, `--outtype f32`: `_set_vocab_sentencepiece` reads
tokenizer.model; tokens, scores, token types, BOS/EOS/UNK ids, add_bos_token true).

Recorded, as llama.cpp (llama-cpp-python, vocab_only) does it on the GGUF, for every string
of runtime/tests/data/tokenizer_oracle.json plus STRINGS below and random strings of the
vocabulary's pieces: the ids of `tokenize(text, add_bos=True, special=False)` and the
text `llama_detokenize` gives back for the ids after the BOS (remove_special false,
unparse_special false); and for SPECIAL_STRINGS, holding control tokens' text, the ids of
`tokenize(text, add_bos=True, special=True)`. The same is recorded for a second, vocabulary-only GGUF
(model-nospace.gguf: the tokenizer metadata alone, with `tokenizer.ggml.add_space_prefix`
false and add_bos false, as llama.cpp's converter writes Gemma's). And transformers' f32
logits of the checkpoint on the first 100 ids of SEQUENCE_TEXT (llama.cpp's, without BOS).

usage: ~/.cache/oracle-venv/bin/python scripts/make_gguf_spm_fixture.py converter/tests/data/gguf-spm
writes: model.gguf, model-nospace.gguf, cases.json (for each file: strings, llama.cpp's ids,
its decoded text), fixture.json (ids, vocab_size, made_by) and logits.bin ([ids, vocab] f32
LE)
needs: sentencepiece, torch, transformers, gguf, llama-cpp-python (the oracle venv);
llama.cpp's sources (LLAMA_CPP, see scripts/llamacpp_convert.py)
"""
import ctypes, json, os, random, sys, tempfile

import sentencepiece as spm
import torch
import transformers
import llama_cpp

sys.path.insert(0, os.path.dirname(__file__))
from make_tiny_fixture import TRAINING_TEXT, SEQUENCE_TEXT, SEQUENCE_LENGTH, randomise  # noqa: E402
from llamacpp_convert import convert, LLAMA_CPP  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..")
ORACLE = os.path.join(ROOT, "runtime/tests/data/tokenizer_oracle.json")

EXTRA_TEXT = """Prices rose 3.75% in Q3 2025 (from $1,249.99 to $1,296.84); 0.5 + 0.25 = 0.75.
Café, naïve, résumé, façade, jalapeño, Zürich, Ångström, São Paulo, Kraków, Ελληνικά.
東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.
Emoji: 🦀 🚀 👍 😀 🎉 — and symbols: © ® ™ € £ ¥ § ¶ † ‡ • … ≤ ≥ ≠ ∞ √ π.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 42 1337 2026 3.14159 2.71828 -17 +23 1e-5.
Punctuation: !?.,;:'"()[]{}<>/\\|@#$%^&*_-+=~` and "quotes", 'single', «guillemets».
    indented line\twith a tab\n\nand two newlines; snake_case, camelCase, kebab-case.
""" * 4

# Beyond the tokenizer oracle's: spaces, newlines, tabs, empty, CJK, emoji, digits.
STRINGS = [
    "", " ", "  ", "   ", "\n", "\t", " \n ", "\n\n\n", "\t\t", "a", " a", "a ", "  a  ",
    "hello world", " hello world", "hello  world", "hello   world   ", "hello\nworld",
    "hello\tworld", "\thello", "line one\nline two\n", "trailing space ", "  leading",
    "東京", "北京是中国的首都", "한국어", "🦀", "🦀🦀", "a🦀b", " 🦀 ", "👍🏽", "❤️",
    "0", "12", "123456789", "3.14159", "1,024", "2026-11-25", "-17 +23",
    "The quick brown fox jumps over the lazy dog.", "Café naïve Zürich Ångström",
    "def f(x):\n    return x ** 2\n", "ünïcödé", "\u00a0non-breaking", "zero\u200bwidth",
    "Ω≈ç√∫", "mixed 東京 and 🦀 and 42.", "▁already▁escaped", "<0x41>", "a\r\nb",
    "!!!???...", "((((", "----", "    four spaces", "a" * 40, " " * 17,
    SEQUENCE_TEXT,
]

# Holding the text of control tokens: recorded with `special=True` (control tokens read as
# such, as the runtime and llama-server read a rendered chat), ids only. With
# `special=False` llama.cpp reads them as text, which a tokenizer.json cannot (its added
# tokens are always split out); and llama.cpp decodes a control token first in the ids as
# nothing that still keeps the space after it, where the tokenizer.json takes it off.
SPECIAL_STRINGS = [
    "<s>", "</s>", "<unk>", "<s>hello</s>", "a<s>", " <s> ", "<s><s>", "x </s> y <unk>z",
    "¶🚀t< 🚀<s>zt zs 4 수t.t9", "not special: <s", "</s>\n<s>user\nhi",
]


def train_sentencepiece(directory):
    text = os.path.join(directory, "text.txt")
    with open(text, "w") as f:
        f.write(TRAINING_TEXT + "\n" + EXTRA_TEXT)
    prefix = os.path.join(directory, "spm")
    spm.SentencePieceTrainer.train(
        input=text, model_prefix=prefix, model_type="bpe", vocab_size=640,
        byte_fallback=True, character_coverage=0.995, split_digits=False,
        max_sentence_length=100000, add_dummy_prefix=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", allow_whitespace_only_pieces=True,
        split_by_whitespace=False, bos_id=1, eos_id=2, unk_id=0, pad_id=-1,
        num_threads=1, minloglevel=2)
    return prefix + ".model"


def random_strings(pieces, count, seed):
    """Strings made of the vocabulary's pieces (and a few characters it lacks), so merges
    between pieces of every kind are exercised."""
    rng = random.Random(seed)
    extra = ["🦀", "ж", "ß", "\t", "\n", " ", "  ", "é", "東", "7"]
    out = []
    for _ in range(count):
        parts = [rng.choice(pieces) if rng.random() < 0.85 else rng.choice(extra)
                 for _ in range(rng.randint(1, 12))]
        out.append("".join(parts).replace("\u2581", " "))
    return out


def detokenize(llm, ids):
    """llama_detokenize of `ids`, special tokens removed and not rendered."""
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    size = 64 + 16 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, False)
    assert 0 <= n <= size, n
    return buf.raw[:n].decode("utf-8")


def record(gguf_path, strings, add_bos):
    llm = llama_cpp.Llama(gguf_path, vocab_only=True, verbose=False)
    cases = []
    for s in strings:
        ids = llm.tokenize(s.encode(), add_bos=add_bos, special=False)
        body = ids[1:] if add_bos else ids
        cases.append({"text": s, "ids": ids, "decoded": detokenize(llm, body)})
    for s in SPECIAL_STRINGS:
        ids = llm.tokenize(s.encode(), add_bos=add_bos, special=True)
        cases.append({"text": s, "ids": ids, "special": True})
    return cases


def vocab_only_copy(src, dst, add_space_prefix, add_bos):
    """The tokenizer metadata of `src` alone (and the architecture's), with the flags
    changed: what llama.cpp reads to tokenize."""
    import gguf
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, "llama")
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name in ("tokenizer.ggml.add_space_prefix", "tokenizer.ggml.add_bos_token"):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, vtype)
    writer.add_add_space_prefix(add_space_prefix)
    writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    oracle = [c["text"] for c in json.load(open(ORACLE))["cases"]]
    with tempfile.TemporaryDirectory() as tmp:
        model_file = train_sentencepiece(tmp)
        sp = spm.SentencePieceProcessor(model_file=model_file)
        vocab_size = sp.get_piece_size()
        pieces = [sp.id_to_piece(i) for i in range(vocab_size)
                  if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))]
        strings = oracle + STRINGS + random_strings(pieces, 400, 20261125)

        torch.manual_seed(20261125)
        config = transformers.LlamaConfig(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        model = transformers.LlamaForCausalLM(config).eval()
        randomise(model)
        hf = os.path.join(tmp, "hf")
        model.save_pretrained(hf, safe_serialization=True)
        os.replace(model_file, os.path.join(hf, "tokenizer.model"))
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False},
                  open(os.path.join(hf, "tokenizer_config.json"), "w"))
        gguf_path = os.path.join(out, "model.gguf")
        convert(hf, gguf_path)
        nospace = os.path.join(out, "model-nospace.gguf")
        vocab_only_copy(gguf_path, nospace, add_space_prefix=False, add_bos=False)

        cases = record(gguf_path, strings, add_bos=True)
        cases_nospace = record(nospace, strings, add_bos=False)
        seq = next(c for c in cases if c["text"] == SEQUENCE_TEXT)
        ids = seq["ids"][1:SEQUENCE_LENGTH + 1]
        assert len(ids) == SEQUENCE_LENGTH, len(ids)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
    byte_fallback = sum(1 for c in cases if any(3 <= i < 3 + 256 for i in c["ids"]))
    logits.numpy().astype("<f4").tofile(os.path.join(out, "logits.bin"))
    versions = (f"llama-cpp-python {llama_cpp.__version__} (llama.cpp's convert_hf_to_gguf.py "
                f"--outtype f32 and its tokenizer), sentencepiece {spm.__version__}, "
                f"transformers {transformers.__version__}, torch {torch.__version__}")
    json.dump({
        "made_by": f"scripts/make_gguf_spm_fixture.py, {versions}, f32 logits, CPU",
        "ids": ids,
        "vocab_size": vocab_size,
        "strings": len(strings) + len(SPECIAL_STRINGS),
        "strings_with_byte_fallback": byte_fallback,
    }, open(os.path.join(out, "fixture.json"), "w"), indent=1)
    json.dump({"made_by": f"scripts/make_gguf_spm_fixture.py, {versions}",
               "model.gguf": cases, "model-nospace.gguf": cases_nospace},
              open(os.path.join(out, "cases.json"), "w"), ensure_ascii=False, indent=0)
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    print(f"wrote {out} ({size} bytes): {len(strings)} + {len(SPECIAL_STRINGS)} strings, {byte_fallback} with byte "
          f"fallback tokens")


if __name__ == "__main__":
    main()
