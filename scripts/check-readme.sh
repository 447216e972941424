#!/usr/bin/env bash
# Compiles the README's embedding example as a user would paste it: a crate of its own with the
# README's [dependencies] block (actorcile's path pointed at this repository) and its main.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=target/readme-crate
rm -rf "$dir" && mkdir -p "$dir/src"
# The first ```toml block and the first ```rust block after "## Embedding".
awk '/^## Embedding/{on=1} on' README.md | awk '
  /^```toml/ && !t {intoml=1; t=1; next}
  /^```/ && intoml {intoml=0; next}
  intoml {print > "/dev/stderr"}
' 2> "$dir/deps.toml"
awk '/^## Embedding/{on=1} on' README.md | awk '
  /^```rust/ && !r {inrust=1; r=1; next}
  /^```/ && inrust {inrust=0; next}
  inrust {print}
' > "$dir/src/main.rs"
grep -q '^\[dependencies\]' "$dir/deps.toml" || { echo "README: no [dependencies] block" >&2; exit 1; }
[ -s "$dir/src/main.rs" ] || { echo "README: no embedding example" >&2; exit 1; }
{
  printf '[package]\nname = "readme-embedding"\nversion = "0.0.0"\nedition = "2024"\npublish = false\n\n'
  printf '# Its own workspace: not a member of the repository'"'"'s.\n[workspace]\n\n'
  sed -E "s#^actorcile = \{ path = \"[^\"]*\"#actorcile = { path = \"$root\"#" "$dir/deps.toml"
} > "$dir/Cargo.toml"
# The repository's lock file, so the example compiles against the versions the tests ran with
# (cargo drops what the example does not use), in the repository's target folder, where the
# dependencies checked by clippy are reused.
cp Cargo.lock "$dir/Cargo.lock"
CARGO_TARGET_DIR="$root/target" cargo check --quiet --manifest-path "$dir/Cargo.toml"
echo "README embedding example: compiles"
