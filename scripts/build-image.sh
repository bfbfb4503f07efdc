#!/usr/bin/env bash
# Builds the spot-worker container image with podman, offline: the
# `spot-worker` command and the `primes` example on `FROM scratch`
# (container/Containerfile), statically linked (scripts/build-static.sh:
# no shared library, not even the C library's) and stripped, with the host's CA certificates, a non-root user (65532) and a user for programs (65533). The same
# binaries drop into any image (docs/deploying.md: `COPY --from`).
#
# Settings (environment): IMAGE (the tag, spot-worker:latest), PROFILE (the
# cargo profile, image: Cargo.toml's profile for the image's size); DEBUG_DIR:
# where the binaries' debug info is kept (`<name>.debug`, for symbolising
# backtraces; default target/<profile>/image-debug when this script builds
# them, none otherwise); SPOT_WORKER_BINARY and PRIMES_BINARY: binaries built already
# (both, or neither: then cargo builds them; a dynamically linked one gets
# the shared libraries `ldd` names and the dynamic loader copied beside
# it). Podman runs through scripts/podman.sh (runc, cgroupfs, vfs;
# SPOT_WORKER_PODMAN_ROOT).
#   scripts/build-image.sh && scripts/podman.sh run --rm spot-worker:latest spot-worker --help
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-spot-worker:latest}"
PROFILE="${PROFILE:-image}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

die() {
  echo "build-image: $*" >&2
  exit 1
}

[[ -f "$CA_BUNDLE" ]] || die "no CA bundle at $CA_BUNDLE (Debian: apt-get install ca-certificates, or set CA_BUNDLE)"
command -v ldd >/dev/null || die "ldd is missing (Debian: libc-bin)"
for tool in strip objcopy readelf; do
  command -v "$tool" >/dev/null || die "$tool is missing (Debian: binutils)"
done

if [[ -n "${SPOT_WORKER_BINARY:-}" && -n "${PRIMES_BINARY:-}" ]]; then
  binaries=("$SPOT_WORKER_BINARY" "$PRIMES_BINARY")
elif [[ -n "${SPOT_WORKER_BINARY:-}${PRIMES_BINARY:-}" ]]; then
  die "set both SPOT_WORKER_BINARY and PRIMES_BINARY, or neither"
else
  # Statically linked (scripts/build-static.sh prints their paths).
  mapfile -t binaries < <(PROFILE="$PROFILE" scripts/build-static.sh)
  ((${#binaries[@]} == 2)) || die "scripts/build-static.sh failed"
  DEBUG_DIR="${DEBUG_DIR:-$(dirname "${binaries[0]}")/image-debug}"
fi
for binary in "${binaries[@]}"; do
  [[ -x "$binary" ]] || die "$binary is not an executable file"
done

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"

# Each binary, stripped (its debug info kept in DEBUG_DIR, if set); then,
# if it is dynamically linked, every library it loads at the path the
# loader looks for it (symlinks resolved: the image holds files, not links
# to nowhere).
for binary in "${binaries[@]}"; do
  # Named as in the image, whatever the file is called here.
  case "$binary" in
    "${binaries[0]}") name=spot-worker ;;
    *) name=primes ;;
  esac
  if [[ -n "${DEBUG_DIR:-}" ]]; then
    mkdir -p "$DEBUG_DIR"
    objcopy --only-keep-debug "$binary" "$DEBUG_DIR/$name.debug"
  fi
  strip --strip-all -o "$rootfs/usr/local/bin/$name" "$binary"
  chmod 0755 "$rootfs/usr/local/bin/$name"
  # ldd fails on a static binary ("not a dynamic executable"): readelf
  # tells them apart (a static-pie has no interpreter).
  if ! readelf --program-headers "$binary" | grep -q INTERP; then
    echo "    $name: statically linked, $(stat -c %s "$rootfs/usr/local/bin/$name") bytes stripped"
    continue
  fi
  echo "    $name: dynamically linked, with its libraries"
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
# spot-worker runs the worker; spot-job is for `spot-worker run
# --program-user spot-job` (docs/command.md: running programs as another user).
echo 'root:x:0:0:root:/root:/sbin/nologin
spot-worker:x:65532:65532:spot-worker:/tmp:/sbin/nologin
spot-job:x:65533:65533:spot-worker programs:/nonexistent:/sbin/nologin' >"$rootfs/etc/passwd"
echo 'root:x:0:
spot-worker:x:65532:
spot-job:x:65533:' >"$rootfs/etc/group"
cp container/Containerfile "$context/Containerfile"

revision="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "==> podman build $IMAGE (revision $revision)"
scripts/podman.sh build --quiet --pull=never --network none \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.title=spot-worker" \
  --tag "$IMAGE" --file "$context/Containerfile" "$context"
echo "==> built $IMAGE"
