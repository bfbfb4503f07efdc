#!/usr/bin/env bash
# Builds the `spot-worker` command and the `primes` example statically
# linked (glibc's static libraries, `-C target-feature=+crt-static`), for
# the container image (scripts/build-image.sh) or any image they are copied
# into (docs/deploying.md), and prints their two paths, one a line.
#
# The profile is `image` (Cargo.toml: fat LTO, one codegen unit, `s`), made
# for the image's size. Both binaries are one `cargo build`: one resolution
# of features (the example's, which has the facade's dev-dependencies), so
# the dependencies are built once for both and the two fat-LTO links run
# side by side; built separately, the example's features (tokio's
# test-util among them) made cargo build most of the tree twice. With
# `--target` (the host's), RUSTFLAGS reach only what is built for the
# target, not build scripts and proc macros (host programs, which cannot be
# static), so the output is target/<host>/<profile>/.
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

host="$(rustc -vV | sed -n 's/^host: //p')"
[[ -n "$host" ]] || {
  echo "build-static: rustc -vV names no host" >&2
  exit 1
}
echo "==> cargo build --profile $PROFILE --target $host (spot-worker, examples/primes), statically linked" >&2
RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" \
  cargo build --locked --profile "$PROFILE" --target "$host" \
  -p spot-worker-cli --bin spot-worker -p spot-worker --example primes >&2
case "$PROFILE" in
  dev | test) out="$target_dir/$host/debug" ;;
  *) out="$target_dir/$host/$PROFILE" ;;
esac
echo "$out/spot-worker"
echo "$out/examples/primes"
