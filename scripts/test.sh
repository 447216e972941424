#!/usr/bin/env bash
# The full test suite, on a fresh Debian 12 machine or a prepared one:
#   1. installs what the tests need (the newest Kubernetes control plane and the oldest supported
#      kube-apiserver, built from Go modules once and cached under ~/.cache/actorcile/k8s/, Helm
#      and promtool the same way under ~/.cache/actorcile/tools/, and Podman) via
#      scripts/install-test-deps.sh;
#   2. checks formatting, lints, docs and that the published crates package;
#   3. runs every test (unit, in-process cluster, real control plane of the newest release) in
#      release mode with cargo-nextest (per-test time limit in .config/nextest.toml), the
#      conformance suite again on the oldest supported release, then the README's main
#      command (`cargo run --release -- bench`, small: its build checked, the tests' build run),
#      then the doc tests;
#   4. checks the dependencies' licenses and sources (cargo deny), runs every fuzz target (fuzz/)
#      for 20 seconds, builds the README example and the guide.
# The Go builds of step 1 run in the background while step 2 runs, so that their module
# downloads and single-threaded links overlap the Rust steps; the fuzz targets and the tools
# needed only after the tests are built, and the fuzz targets run, beside the tests on the CPU
# they leave idle (`beside_tests` says how). Every step's time is printed at the end. The tools it
# needs (cargo-deny, cargo-nextest, cargo-fuzz, mdbook) are built once, unoptimised and without
# debug info (they run for seconds; such a build compiles faster), into ~/.cache/actorcile/.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target
# Every release build here (the tests, the README's bench, the doc tests) without debug info:
# they are built once and run, never profiled, and debug info only lengthens build and link.
# (The release profile keeps them for `cargo run --release` under a profiler.)
export CARGO_PROFILE_RELEASE_DEBUG=false
# The unoptimised builds (the unit tests without features, the packaged crates' builds, the fuzz
# targets) with line tables only, and no build incremental: both are for a developer's next
# rebuild, and here they only fill the disk (together about half of the target folder).
export CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_INCREMENTAL=0
# The tests' builds: the workspace's crates at opt-level 1 (scripts/test-build.toml says why).
test_build=(--config scripts/test-build.toml)

timings=""
step_name=""
step_start=$SECONDS
suite_start=$SECONDS
end_step() {
  if [ -n "$step_name" ]; then
    timings+="$(printf '%6d s  %s' "$((SECONDS - step_start))" "$step_name")"$'\n'
  fi
}
step() {
  end_step
  step_name="$*"
  step_start=$SECONDS
  printf '\n==> %s\n' "$*"
}
report_timings() {
  end_step
  step_name=""
  printf '\n==> time per step (%d s in all)\n%s' "$((SECONDS - suite_start))" "$timings"
  df -h . | awk 'NR == 2 {print "disk: " $4 " free of " $2 " where the target folder is"}'
}
on_exit() {
  local pid
  for pid in "${background_pids[@]}"; do
    kill_tree "$pid"
  done
  report_timings
}
trap on_exit EXIT

# cargo_tool NAME CRATE VERSION [ARGS...]: NAME from PATH, else built once into the cache (ARGS
# go to cargo install: the features a tool needs here, not the ones it has for daily use).
cargo_tool() {
  local name="$1" crate="$2" version="${3:-}" root="$HOME/.cache/actorcile/$2"
  if command -v "$name" >/dev/null 2>&1; then
    command -v "$name"
    return
  fi
  if [ ! -x "$root/bin/$name" ]; then
    # Unoptimised and without debug info: both only lengthen the build of a tool run for seconds.
    CARGO_PROFILE_DEV_DEBUG=false cargo install --locked --debug --quiet "$crate" \
      ${version:+--version "$version"} "${@:4}" --root "$root" >&2
  fi
  echo "$root/bin/$name"
}

# fuzz_short: every fuzz target (fuzz/) built, then run for 20 seconds each; the long runs are in
# RELIABILITY.md. cargo-fuzz passes nightly-only flags to rustc; RUSTC_BOOTSTRAP lets the
# machine's one stable toolchain accept them. No sanitizer (-s none): the code under test is safe
# Rust, and libFuzzer's coverage guidance is what finds inputs; a panic or a failed check is the
# crash. A dev build (--dev): overflow checks and debug assertions on, and half the build time of
# an optimised one. The targets run one per core (libFuzzer runs on one thread).
fuzz_short() {
  local fuzz_root
  fuzz_root=$(dirname "$(cargo_tool cargo-fuzz cargo-fuzz 0.13.2)")/..
  (
    cd fuzz
    export PATH="$fuzz_root/bin:$PATH" RUSTC_BOOTSTRAP=1
    cargo fuzz build --dev -s none
    touch ../target/fuzz-built
    fuzz_one() {
      local target="$1" log="../target/fuzz-$1.log"
      if ! cargo fuzz run --dev -s none "$target" -- \
        -max_total_time=20 -print_final_stats=1 >"$log" 2>&1; then
        tail -n 40 "$log"
        echo "fuzz target $target failed (its input is in fuzz/artifacts/$target/)"
        return 1
      fi
      echo "fuzz target $target: $(grep -E '^Done' "$log")"
    }
    running=0
    failed=0
    for target in $(cargo fuzz list); do
      if [ "$running" -ge "$(nproc)" ]; then
        wait -n || failed=1
        running=$((running - 1))
      fi
      fuzz_one "$target" &
      running=$((running + 1))
    done
    while [ "$running" -gt 0 ]; do
      wait -n || failed=1
      running=$((running - 1))
    done
    exit "$failed"
  )
}

# beside_tests LOG COMMAND...: COMMAND in the background under the idle scheduling policy, its
# output in LOG; its pid in `beside_pid`. The test run leaves most of the CPU idle (its tests wait
# on API servers, processes and timers: 63 % idle on 2 cores, one test per core),
# so work that needs no result before the tests' end runs there instead of after them. SCHED_IDLE
# (`chrt --idle`), not `nice`: a process under it runs only on a CPU nothing else wants, and gives
# way at once when a test wakes. Two busy loops at nice 19 made a chaos round take 115 s instead
# of 60; under SCHED_IDLE it took 54.
beside_tests() {
  local log="$1"
  shift
  ( chrt --idle -p 0 "$BASHPID"; "$@" ) >"$log" 2>&1 &
  beside_pid=$!
  background_pids+=("$beside_pid")
}
# kill_tree PID: PID and every process under it.
kill_tree() {
  local child
  for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    kill_tree "$child"
  done
  kill "$1" 2>/dev/null || true
}
# wait_beside NAME PID LOG: waits for a job of beside_tests; on failure prints its log and fails.
wait_beside() {
  if ! wait "$2"; then
    tail -n 60 "$3"
    echo "$1 failed (its whole output: $3)"
    exit 1
  fi
}
background_pids=()
# build_tools FUZZ_PID: the tools needed only after the tests, built once the fuzz targets are (or
# their job ended): the fuzz runs take 20 s each on the clock whatever CPU they get, so their build
# goes first and they run while the tools build.
build_tools() {
  while [ ! -e target/fuzz-built ] && kill -0 "$1" 2>/dev/null; do
    sleep 1
  done
  cargo_tool cargo-deny cargo-deny 0.20.2
  cargo_tool mdbook mdbook 0.4.52 --no-default-features
}

step "installing test dependencies (in the background: target/install-test-deps.log)"
bash scripts/install-test-deps.sh >target/install-test-deps.log 2>&1 &
deps_pid=$!

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "the library's feature sets, each checked on its own"
# clippy above sees every feature at once; an item used outside its feature's gate shows only
# in a build without that feature (as a user's, or the fuzz targets'). The Kubernetes version is
# the binary's choice: here the oldest the crate supports. Warnings are errors here too (an
# item only one feature uses is dead code without it).
for features in "" "--no-default-features" \
  "--no-default-features --features metrics" "--no-default-features --features admin" \
  "--no-default-features --features telemetry" "--no-default-features --features cli" \
  "--no-default-features --features operator" "--no-default-features --features otel" \
  "--no-default-features --features cluster" "--no-default-features --features envtest" \
  "--no-default-features --features docker" "--no-default-features --features fuzzing" \
  "--no-default-features --features webhooks" "--no-default-features --features webhooks,ring" \
  "--no-default-features --features rustls-tls,aws-lc-rs"; do
  # shellcheck disable=SC2086 # the feature flags split into words on purpose
  RUSTFLAGS="-D warnings" K8S_OPENAPI_ENABLED_VERSION=1.33 cargo check --quiet -p actorcile --lib $features
done

step "the MSRV: the library (every feature) and the CLI build with the stated rust-version"
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
if rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
  # A target folder of its own, removed after: another compiler's artifacts would only crowd the
  # main one.
  # Every feature but kube's other TLS stacks: openssl-tls brings parking_lot 0.13 (through
  # hyper-openssl), which needs a newer Rust, and aws-lc-rs adds only a C build.
  CARGO_TARGET_DIR=target/msrv RUSTFLAGS="-D warnings" cargo +"$msrv" check --quiet --locked \
    -p actorcile --lib --features cluster,envtest,docker,operator,otel,fuzzing,webhooks -p actorcile-cli
  rm -rf target/msrv
else
  echo "!!! SKIPPED: rustup cannot install Rust $msrv on this machine; the MSRV is not checked" >&2
fi

step "another Unix than Linux: the library, envtest and the CLI (with their tests) check for FreeBSD"
# Linux reads /proc and uses pidfds; the other Unixes go another way (sysinfo), checked here by
# compiling for one (the C parts, ring and mimalloc, build with the host's compiler; macOS's
# need Apple's toolchain). The features are the MSRV check's.
if rustup target add x86_64-unknown-freebsd >/dev/null 2>&1; then
  RUSTFLAGS="-D warnings" cargo check --quiet --locked --target x86_64-unknown-freebsd \
    -p actorcile --features cluster,envtest,docker,operator,otel,fuzzing,webhooks \
    -p actorcile-envtest -p actorcile-cli --all-targets
  # Only checked: its metadata would stay on the disk through the release build.
  rm -rf target/x86_64-unknown-freebsd
else
  echo "!!! SKIPPED: rustup cannot add the x86_64-unknown-freebsd target here; no other Unix is checked" >&2
fi

step "the library's unit tests without any feature"
# The unit tests run on the in-process server (a dev-dependency), whatever the features.
K8S_OPENAPI_ENABLED_VERSION=1.33 cargo test --quiet -p actorcile --lib --no-default-features

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps

step "cargo package: the published crates package and build from their tarballs"
# Verified: each crate is built from its own tarball, the path dependencies among them through
# a local registry of the others' tarballs (what a user gets from crates.io). The examples
# (publish = false) are not packaged.
# cargo unpacks the tarballs it builds against under the registry's source folder and reuses an
# unpacked copy of the same version: without this, a second run builds a changed crate's
# dependents against the first run's copy of it.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/actorcile{,-apiserver,-envtest,-cli}-0.1.0
cargo package --quiet --allow-dirty -p actorcile-apiserver -p actorcile-envtest -p actorcile \
  -p actorcile-cli
rm -rf target/package

step "cargo-nextest"
# Without its self-update (an HTTP client and an archive reader nobody runs here).
nextest=$(cargo_tool cargo-nextest cargo-nextest 0.9.151 --no-default-features --features default-no-update)
export PATH="$(dirname "$nextest"):$PATH"

step "waiting for the test dependencies"
if ! wait "$deps_pid"; then
  cat target/install-test-deps.log
  echo "scripts/install-test-deps.sh failed (its output is above)"
  exit 1
fi
grep -E '^( *took|    (built|reusing|newest|oldest|podman))' target/install-test-deps.log || true

step "the tests' build (release mode)"
# --tests: the library's, the binaries' and the integration tests; not the examples, which
# clippy --all-targets has checked above and which cargo would otherwise link in release (a
# quarter of the whole test build) without running them.
tests=("${test_build[@]}" --release --workspace --all-features --tests)
cargo nextest run "${tests[@]}" --no-run

step "tests (beside them, on idle CPU: the fuzz targets, cargo-deny and mdbook built, fuzzing)"
# Only once the build is done: the build keeps both cores busy (beside it, at nice 19, they
# lengthened it by about two minutes).
rm -f target/fuzz-built
beside_tests target/fuzz.log fuzz_short
fuzz_pid=$beside_pid
beside_tests target/tools.log build_tools "$fuzz_pid"
tools_pid=$beside_pid
profile=default
[ "${CI:-}" = "true" ] && profile=ci
# The binaries come from the cache (the newest release), whatever the caller's environment says.
unset KUBEBUILDER_ASSETS ACTORCILE_KUBE_ASSETS
cargo nextest run "${tests[@]}" --profile "$profile"

oldest="$(cat "${ACTORCILE_CACHE_DIR:-$HOME/.cache/actorcile}/k8s/oldest")"
step "the conformance suite and the conversion webhook on the oldest supported Kubernetes release ($oldest)"
ACTORCILE_KUBE_ASSETS="${ACTORCILE_CACHE_DIR:-$HOME/.cache/actorcile}/k8s/$oldest/bin" \
  cargo nextest run "${test_build[@]}" --release --all-features --profile "$profile" --test integration \
  -E 'test(/^conformance::real_apiserver::/) | test(/^real_webhooks::conversion_/)'

step "the README's main command (small): its build checked, then run from the tests' build"
# `cargo run --release -- bench` builds the CLI with the default members' features at the release
# profile: a build of its own (two minutes on 2 cores) that differs from the tests' build of the
# CLI only in features (the library's `docker`, `fuzzing` and `bench-internals`, and those the
# tests' dev-dependencies turn on in shared dependencies) and in the workspace crates' opt-level.
# So that build is checked as a user's (`cargo check`: the default members, their default
# features; the dependencies were checked by clippy above), and the command runs from the tests'
# build of the CLI.
cargo check --quiet
cli="${CARGO_TARGET_DIR:-target}/release/actorcile"
"$cli" bench --objects 500 --repeat 1 > /dev/null
"$cli" simulate --list > /dev/null

step "the examples the docs tell users to run, small, and what they print"
# Linked here (not in the tests' build, which has no examples): the dependencies are the tests'.
cargo build "${test_build[@]}" --release --all-features --examples --quiet
examples="${CARGO_TARGET_DIR:-target}/release/examples"
# expect <text> <command...>: the command succeeds and prints <text>.
expect() {
  local text=$1 out
  shift
  if ! out=$("$@" 2>&1); then
    printf '%s\n' "$out"
    echo "failed: $*"
    exit 1
  fi
  if ! grep -qF -- "$text" <<<"$out"; then
    printf '%s\n' "$out"
    echo "$* did not print: $text"
    exit 1
  fi
}
expect '"leaked_finalizers":0,"objects":50,"ready":50' "$examples/quickstart" --objects 50
expect '"backend":"in-process","links":5,' "$examples/chain" --links 5 --yield-delay 50ms
expect '"objects":100,"runs":' "$examples/config_fanout" --objects 100
expect 'acme is gone: web no longer in the edge, 0 cluster registrations left' "$examples/remote_app"
expect '"live_actors":0,"objects":200,"passivations":200' "$examples/idle_memory" --objects 200
expect '"backend":"in-process","concurrency":32,' "$examples/write_ceiling" --objects 50
expect 'webhooks       1' "$examples/webhook_latency" --objects 50 --rounds 1
expect 'adaptive (≤32)' "$examples/adaptive" --objects 200 --fixed 8,32
expect 'summary: 4 networks and 24 clusters Ready' \
  "${CARGO_TARGET_DIR:-target}/release/example-operator" demo
# The production chapter's dashboard picture, drawn the way the chapter says (smaller).
expect 'summary: 20 networks and 1000 clusters Ready' \
  "${CARGO_TARGET_DIR:-target}/release/example-operator" demo --networks 20 \
  --clusters-per-network 50 --scrape-to target/scrapes-check.txt
expect 'target/dashboard-check.png: ' "$cli" plot-dashboard target/scrapes-check.txt \
  --out target/dashboard-check.png

step "doc tests (the API docs, README and user guide code blocks)"
# In release, with the features of the tests above: the dependencies built for them are reused.
cargo test "${test_build[@]}" --release --workspace --all-features --doc

step "cargo deny check licenses bans sources (deny.toml)"
wait_beside "building cargo-deny and mdbook" "$tools_pid" target/tools.log
cargo_deny=$(cargo_tool cargo-deny cargo-deny 0.20.2)
# Offline: the advisories check needs the RustSec database from GitHub, which these machines
# cannot reach, so it is not run here (deny.toml says so too).
echo "note: cargo deny check advisories is skipped: its database cannot be fetched on this machine"
# cargo deny reads the metadata of every target's dependencies; the builds above only fetched
# this machine's.
cargo fetch --locked
"$cargo_deny" --offline check licenses bans sources

step "fuzz targets: a short run of each (fuzz/; built and run beside the tests)"
wait_beside "fuzzing" "$fuzz_pid" target/fuzz.log
grep -E '^fuzz target ' target/fuzz.log

step "the README's embedding example, compiled as a crate of its own"
bash scripts/check-readme.sh

step "the user guide (mdbook build)"
# Only `mdbook build`: without the server, the file watcher and the search index.
mdbook=$(cargo_tool mdbook mdbook 0.4.52 --no-default-features)
"$mdbook" build docs --dest-dir "$(pwd)/target/guide"
