#!/usr/bin/env bash
# What the layer's decision reporting costs a request: instructions per request under
# callgrind (benches/layer_instructions.rs) for a commit from before the reporting
# existed and for this checkout with and without the `metrics` feature; with `--criterion`,
# criterion's wall time (benches/layer.rs) for the same three builds as well.
# The results and how to read them: benches/results/decision-report-cost.md.
#
#   benches/decision-report-cost.sh [--criterion] [BEFORE]     (BEFORE: default 5a34d95)
#
# Run from the repository root; needs valgrind. It adds a worktree of BEFORE beside this
# one (removed at the end), copies the instruction bench into it (the bench is newer than
# that commit) and builds there without the `decision` feature, whose rows need the hook.
# CARGO_TARGET_DIR is honoured; CARGO may be set to a wrapper (e.g. "flock LOCK nice cargo").
set -euo pipefail

criterion=false
if [[ "${1:-}" == "--criterion" ]]; then
    criterion=true
    shift
fi
before="${1:-5a34d95}"
cargo_cmd=(${CARGO:-cargo})
root="$(git rev-parse --show-toplevel)"
target="${CARGO_TARGET_DIR:-$root/target}"
export CARGO_TARGET_DIR="$target"
old="$(mktemp -d)/before"
bins="$(mktemp -d)"
trap 'git -C "$root" worktree remove --force "$old" 2>/dev/null || true; rm -rf "$bins"' EXIT

git -C "$root" worktree add --detach "$old" "$before" >/dev/null
cp "$root/benches/layer_instructions.rs" "$old/benches/"
# The bench's dependencies and its [[bin]] (the commit's own layer bench is left as it is).
python3 - "$old/benches/Cargo.toml" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
if 'name = "layer_instructions"' in text:
    sys.exit(0)  # a commit that has the bench already
anchor = "\n[dev-dependencies]"
deps = 'http-body.workspace = true\ntower = { workspace = true, features = ["util"] }\n'
text = text.replace(anchor, "\n" + deps + anchor, 1)
text += '\n[[bin]]\nname = "layer_instructions"\npath = "layer_instructions.rs"\ntest = false\nbench = false\n'
open(path, "w").write(text)
EOF

build() { # DIR NAME CARGO-ARGS...
    local dir="$1" name="$2"
    shift 2
    (cd "$dir" && "${cargo_cmd[@]}" build --release -p idemcache-benches --bin layer_instructions "$@")
    cp "$target/release/layer_instructions" "$bins/$name"
}
build "$old" before --no-default-features
build "$root" after
build "$root" after-metrics --features metrics

echo "## before ($before): no decision reporting"
"$bins/before" bare layer
echo
echo "## after ($(git -C "$root" rev-parse --short HEAD)), default features"
"$bins/after"
echo
echo "## after, feature metrics"
"$bins/after-metrics" layer recorder

if $criterion; then
    (cd "$old" && "${cargo_cmd[@]}" bench -p idemcache-benches --bench layer)
    (cd "$root" && "${cargo_cmd[@]}" bench -p idemcache-benches --bench layer)
    (cd "$root" && "${cargo_cmd[@]}" bench -p idemcache-benches --bench layer --features metrics)
fi
