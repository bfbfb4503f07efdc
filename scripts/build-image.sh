#!/usr/bin/env bash
# Builds the spot-worker container image with podman, offline: the
# `spot-worker` command and the `primes` example on `FROM scratch`
# (container/Containerfile), with the shared libraries `ldd` names, the
# dynamic loader, the host's CA certificates and a non-root user (65532).
#
# Settings (environment): IMAGE (the tag, spot-worker:latest), PROFILE (the
# cargo profile, release); SPOT_WORKER_BINARY and PRIMES_BINARY: binaries
# built already (both, or neither: then cargo builds them; the tests pass
# theirs). Podman runs through
# scripts/podman.sh (runc, cgroupfs, vfs; SPOT_WORKER_PODMAN_ROOT).
#   scripts/build-image.sh && scripts/podman.sh run --rm spot-worker:latest spot-worker --help
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-spot-worker:latest}"
PROFILE="${PROFILE:-release}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

die() {
  echo "build-image: $*" >&2
  exit 1
}

[[ -f "$CA_BUNDLE" ]] || die "no CA bundle at $CA_BUNDLE (Debian: apt-get install ca-certificates, or set CA_BUNDLE)"
command -v ldd >/dev/null || die "ldd is missing (Debian: libc-bin)"

if [[ -n "${SPOT_WORKER_BINARY:-}" && -n "${PRIMES_BINARY:-}" ]]; then
  binaries=("$SPOT_WORKER_BINARY" "$PRIMES_BINARY")
elif [[ -n "${SPOT_WORKER_BINARY:-}${PRIMES_BINARY:-}" ]]; then
  die "set both SPOT_WORKER_BINARY and PRIMES_BINARY, or neither"
else
  echo "==> cargo build --profile $PROFILE (spot-worker, examples/primes)"
  cargo build --locked --profile "$PROFILE" -p spot-worker-cli --bin spot-worker
  cargo build --locked --profile "$PROFILE" --example primes
  case "$PROFILE" in
    dev | test) out=target/debug ;;
    *) out="target/$PROFILE" ;;
  esac
  binaries=("$out/spot-worker" "$out/examples/primes")
fi
for binary in "${binaries[@]}"; do
  [[ -x "$binary" ]] || die "$binary is not an executable file"
done

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"

# Each binary, then every library it loads at the path the loader looks
# for it (symlinks resolved: the image holds files, not links to nowhere).
for binary in "${binaries[@]}"; do
  # Named as in the image, whatever the file is called here.
  case "$binary" in
    "${binaries[0]}") name=spot-worker ;;
    *) name=primes ;;
  esac
  install -m 0755 "$binary" "$rootfs/usr/local/bin/$name"
  linked="$(ldd "$binary")" || die "ldd $binary failed"
  if grep -q 'not found' <<<"$linked"; then
    die "$binary needs libraries this machine lacks:
$linked"
  fi
  # Lines are `name => /path (addr)`, or `/path (addr)` for the loader;
  # linux-vdso has no file.
  while read -r library; do
    mkdir -p "$rootfs$(dirname "$library")"
    cp -L "$library" "$rootfs$library"
  done < <(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$linked")
done

cp -L "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
echo 'root:x:0:0:root:/root:/sbin/nologin
spot-worker:x:65532:65532:spot-worker:/tmp:/sbin/nologin' >"$rootfs/etc/passwd"
echo 'root:x:0:
spot-worker:x:65532:' >"$rootfs/etc/group"
cp container/Containerfile "$context/Containerfile"

revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "==> podman build $IMAGE (revision $revision)"
scripts/podman.sh build --quiet --pull=never --network none \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.title=spot-worker" \
  --tag "$IMAGE" --file "$context/Containerfile" "$context"
echo "==> built $IMAGE"
