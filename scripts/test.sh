#!/usr/bin/env bash
# The full test suite, on a fresh Debian 12 machine or a prepared one:
#   1. installs what the tests need (the newest Kubernetes control plane and the oldest supported
#      kube-apiserver, built from Go modules once and cached under ~/.cache/actorcile/k8s/, and
#      Podman) via scripts/install-test-deps.sh;
#   2. checks formatting, lints, docs and the dependencies' licenses and sources (cargo deny);
#   3. runs every test (unit, in-process cluster, real control plane of the newest release) in
#      release mode with cargo-nextest (per-test time limit in .config/nextest.toml), the
#      conformance suite again on the oldest supported release, then the README's main
#      command as a user runs it (`cargo run --release -- bench`, small), then the doc tests;
#   4. runs every fuzz target (fuzz/) for 20 seconds, builds the README example and the guide.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "installing test dependencies"
bash scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps

step "cargo deny check licenses bans sources (deny.toml)"
deny_root="$HOME/.cache/actorcile/cargo-deny"
if [ ! -x "$deny_root/bin/cargo-deny" ]; then
  cargo install --locked cargo-deny --version 0.20.2 --root "$deny_root"
fi
# Offline: the advisories check needs the RustSec database from GitHub, which these machines
# cannot reach, so it is not run here (deny.toml says so too).
echo "note: cargo deny check advisories is skipped: its database cannot be fetched on this machine"
# cargo deny reads the metadata of every target's dependencies; the builds above only fetched
# this machine's.
cargo fetch --locked
"$deny_root/bin/cargo-deny" --offline check licenses bans sources

# cargo-nextest from PATH, else built once into the cache (as cargo-deny, cargo-fuzz and mdbook).
nextest_root="$HOME/.cache/actorcile/cargo-nextest"
if ! command -v cargo-nextest >/dev/null 2>&1; then
  if [ ! -x "$nextest_root/bin/cargo-nextest" ]; then
    step "installing cargo-nextest"
    cargo install --locked cargo-nextest --root "$nextest_root"
  fi
  export PATH="$nextest_root/bin:$PATH"
fi

step "tests (release mode)"
profile=default
[ "${CI:-}" = "true" ] && profile=ci
# The binaries come from the cache (the newest release), whatever the caller's environment says.
unset KUBEBUILDER_ASSETS ACTORCILE_KUBE_ASSETS
cargo nextest run --release --workspace --all-features --profile "$profile"

oldest="$(cat "${ACTORCILE_CACHE_DIR:-$HOME/.cache/actorcile}/k8s/oldest")"
step "the conformance suite on the oldest supported Kubernetes release ($oldest)"
ACTORCILE_KUBE_ASSETS="${ACTORCILE_CACHE_DIR:-$HOME/.cache/actorcile}/k8s/$oldest/bin" \
  cargo nextest run --release --all-features --profile "$profile" --test integration \
  -E 'test(/^conformance::real_apiserver::/)'

step "the README's main command, as a user runs it (small): cargo run --release -- bench"
cargo run --release -- bench --objects 500 --repeat 1 > /dev/null
cargo run --release -- simulate --list > /dev/null

step "doc tests (the API docs, README and user guide code blocks)"
cargo test --workspace --all-features --doc

step "fuzz targets: a short run of each (fuzz/; the long runs are in RELIABILITY.md)"
fuzz_root="$HOME/.cache/actorcile/cargo-fuzz"
if [ ! -x "$fuzz_root/bin/cargo-fuzz" ]; then
  cargo install --locked cargo-fuzz --version 0.13.2 --root "$fuzz_root"
fi
# cargo-fuzz passes nightly-only flags to rustc; RUSTC_BOOTSTRAP lets the machine's one stable
# toolchain accept them. No sanitizer (-s none): the code under test is safe Rust, and libFuzzer's
# coverage guidance is what finds inputs; a panic or a failed check is the crash.
(
  cd fuzz
  for target in $(PATH="$fuzz_root/bin:$PATH" RUSTC_BOOTSTRAP=1 cargo fuzz list); do
    log="../target/fuzz-$target.log"
    if ! PATH="$fuzz_root/bin:$PATH" RUSTC_BOOTSTRAP=1 cargo fuzz run -s none -O "$target" -- \
      -max_total_time=20 -print_final_stats=1 >"$log" 2>&1; then
      tail -n 40 "$log"
      echo "fuzz target $target failed (its input is in fuzz/artifacts/$target/)"
      exit 1
    fi
    echo "$target: $(grep -E '^Done' "$log")"
  done
)

step "the README's embedding example, built as a crate of its own"
bash scripts/check-readme.sh

step "the user guide (mdbook build)"
mdbook_root="$HOME/.cache/actorcile/mdbook"
if [ ! -x "$mdbook_root/bin/mdbook" ]; then
  cargo install --locked mdbook --version 0.4.52 --root "$mdbook_root"
fi
"$mdbook_root/bin/mdbook" build docs --dest-dir "$(pwd)/target/guide"
