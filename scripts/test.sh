#!/usr/bin/env bash
# The one command that runs every check on a fresh machine: it installs what
# the tests need, then runs formatting, lints and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Tests only talk to loopback; never let a proxy setting reroute them.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo test"
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
