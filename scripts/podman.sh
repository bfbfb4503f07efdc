#!/usr/bin/env bash
# Runs podman with the settings proven to work on the project's machines and
# CI: usage scripts/podman.sh PODMAN-ARGS... (e.g. `scripts/podman.sh images`).
#
# Why each setting (Debian's podman 4.3 on a host with hybrid cgroups):
# - runtime runc: crun refuses to start containers under hybrid cgroups;
# - cgroup manager cgroupfs: no systemd session to ask for a scope;
# - storage driver vfs: works on any filesystem, no overlay module needed;
# - default_ulimits = []: the distribution's default ulimits are refused.
# The containers.conf is written here, never read from /etc, so the host's
# configuration cannot change what the tests and scripts/build-image.sh see;
# CONTAINERS_CONF set by the caller wins. SPOT_WORKER_PODMAN_ROOT (optional)
# keeps images and containers in a storage root of their own.
set -euo pipefail

command -v podman >/dev/null || {
  echo "podman is not installed (Debian: apt-get install podman runc)" >&2
  exit 127
}

if [[ -z "${CONTAINERS_CONF:-}" ]]; then
  conf_dir="${TMPDIR:-/tmp}/spot-worker-podman-$(id -u)"
  mkdir -p "$conf_dir"
  CONTAINERS_CONF="$conf_dir/containers.conf"
  # Written to a temporary file and renamed: parallel callers never read half.
  tmp="$(mktemp "$conf_dir/containers.conf.XXXXXX")"
  cat >"$tmp" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
CONF
  mv -f "$tmp" "$CONTAINERS_CONF"
  export CONTAINERS_CONF
fi

global=(--runtime runc --cgroup-manager cgroupfs --storage-driver vfs)
if [[ -n "${SPOT_WORKER_PODMAN_ROOT:-}" ]]; then
  global+=(--root "$SPOT_WORKER_PODMAN_ROOT/storage" --runroot "$SPOT_WORKER_PODMAN_ROOT/run")
fi
exec podman "${global[@]}" "$@"
