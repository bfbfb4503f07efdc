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
# The example is in a package of its own whose dependencies are the
# command's (examples/Cargo.toml), so the two builds resolve the same
# features and the second compiles only the example. (Not one `cargo build`
# of both: with the facade's dev-dependencies the command grew the image
# past its 25 MB, 25.2 MB in CI's rehearsal of 2026-11-29; and one build
# needs --target for crt-static, a target directory of its own, which the
# README's `cargo install --profile image` would not share.)
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
cargo rustc --locked --profile "$PROFILE" -p spot-worker-examples --example primes "${static[@]}" >&2
case "$PROFILE" in
  dev | test) out="$target_dir/debug" ;;
  *) out="$target_dir/$PROFILE" ;;
esac
echo "$out/spot-worker"
echo "$out/examples/primes"
