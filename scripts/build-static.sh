#!/usr/bin/env bash
# Builds the `spot-worker` command and the `primes` example statically
# linked (glibc's static libraries, `-C target-feature=+crt-static`), for
# the container image (scripts/build-image.sh) or any image they are copied
# into (docs/deploying.md), and prints their two paths, one a line.
#
# The profile is `image` (Cargo.toml: fat LTO, one codegen unit, `s`), made
# for the image's size; it has a target/image of its own. `cargo rustc`
# gives crt-static to the final binaries only: the dependencies (and proc
# macros, which cannot be static) are the same build as `cargo build` of the
# profile, so the two binaries share them and only the final links differ.
# (Not one `cargo build` of both: it would resolve the command's features
# with the example's dev-dependencies, tokio's test-util and the blob
# SDK's tokio feature among them, and the command grew the image past its
# 25 MB: 25.2 MB, measured in CI's rehearsal of 2026-11-29.)
# Names are resolved by the binaries themselves (reqwest's hickory-dns
# reads /etc/hosts and /etc/resolv.conf), so glibc's NSS, which a static
# binary cannot load, is never needed.
#
# Settings (environment): PROFILE (the cargo profile, image);
# CARGO_TARGET_DIR (target).
#   scripts/build-static.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PROFILE="${PROFILE:-image}"
target_dir="${CARGO_TARGET_DIR:-target}"
[[ -f /usr/lib/x86_64-linux-gnu/libc.a ]] ||
  echo "build-static: no /usr/lib/x86_64-linux-gnu/libc.a (Debian: apt-get install libc6-dev)" >&2

static=(-- -C target-feature=+crt-static)
echo "==> cargo rustc --profile $PROFILE (spot-worker, examples/primes), statically linked" >&2
cargo rustc --locked --profile "$PROFILE" -p spot-worker-cli --bin spot-worker "${static[@]}" >&2
cargo rustc --locked --profile "$PROFILE" -p spot-worker --example primes "${static[@]}" >&2
case "$PROFILE" in
  dev | test) out="$target_dir/debug" ;;
  *) out="$target_dir/$PROFILE" ;;
esac
echo "$out/spot-worker"
echo "$out/examples/primes"
