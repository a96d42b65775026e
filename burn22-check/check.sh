#!/usr/bin/env bash
# Burn 0.22 reads the converter's model.bpk and generates what our runtime generates.
# Converts the fetched SmolLM2 with --burnpack into target/burn22-artifact (artifacts/ and
# its committed manifest stay as `just convert` leaves them), then decodes a prompt greedily
# with this crate (Burn 0.22, flex backend, BurnpackStore) and with `runtime --temperature 0`,
# and compares the generated token ids. Run from anywhere; `just burn22-check` builds first.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/smollm2-135m-instruct}
out=target/burn22-artifact
prompt=${PROMPT:-"The capital of France is"}
tokens=${TOKENS:-32}
bin=target/release

# Converted again only if the checkpoint or the artifact changed since (verify checks both).
if ! "$bin/converter" verify "$out" --source "$model" 2>/dev/null; then
    "$bin/converter" convert "$model" "$out" --burnpack
fi
cargo build --quiet --release --manifest-path burn22-check/Cargo.toml --target-dir target/burn22-check

ours=$("$bin/runtime" --artifacts "$out" --prompt "$prompt" --temperature 0 \
    --max-new-tokens "$tokens" --json)
burn22=$(target/burn22-check/release/burn22-check "$out" "$prompt" "$tokens")
python3 - "$ours" "$burn22" <<'PY'
import json, sys
ours, burn22 = (json.loads(arg)["tokens"] for arg in sys.argv[1:])
print(f"runtime:     {ours}\nburn 0.22:   {burn22}")
if ours != burn22:
    sys.exit("error: Burn 0.22 on model.bpk generates other tokens than the runtime")
print(f"burn22-check: the same {len(ours)} greedy tokens")
PY
