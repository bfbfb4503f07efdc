#!/usr/bin/env bash
# Run once by cloud-init (runcmd): downloads the worker binary, and the
# application bundle when the deployment names one, from the deployment's
# artifacts container with the scale set's user-assigned managed identity (an
# IMDS token; no key, no SAS), checks their SHA-256, installs the binary,
# unpacks the bundle into /opt/spot-worker/app (the unit's working directory)
# and only then starts spot-worker.service. {{...}} are filled in by
# ../modules/compute.bicep.
#
# SPOT_WORKER_INSTALL_ROOT (unset on a VM) installs under that directory
# instead of / and leaves systemd alone: tests/it/vm_in_a_box.rs runs this script
# for real (token from IMDS, HTTPS download, hash check) into a scratch root.
set -euo pipefail

readonly BINARY_URL='{{workerBinaryUrl}}'
readonly BINARY_SHA256='{{workerBinarySha256}}'
readonly BUNDLE_URL='{{workerBundleUrl}}'
readonly BUNDLE_SHA256='{{workerBundleSha256}}'
readonly CLIENT_ID='{{clientId}}'
readonly ROOT="${SPOT_WORKER_INSTALL_ROOT:-}"
readonly DEST="${ROOT}/opt/spot-worker/bin/worker"
readonly APP="${ROOT}/opt/spot-worker/app"
readonly IMDS=http://169.254.169.254
# Role assignments can take minutes to propagate after a deployment, and the
# deploy script uploads the binary after the storage exists: keep trying for
# about 30 minutes before giving up (the health probe then fails and automatic
# repairs replace the VM).
readonly ATTEMPTS=70

log() { echo "install-worker: $*" >&2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fetch_token() {
  curl -fsS --noproxy '*' --max-time 10 -H 'Metadata: true' \
    "${IMDS}/metadata/identity/oauth2/token?api-version=2018-02-01&resource=https%3A%2F%2Fstorage.azure.com%2F&client_id=${CLIENT_ID}" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])'
}

# usage: download URL SHA256 FILE
download() {
  local token
  token="$(fetch_token)" || return 1
  # The token goes to curl through a file, never on a command line (ps).
  printf 'Authorization: Bearer %s\n' "$token" >"$work/auth-header"
  curl -fsS --max-time 300 --retry 3 \
    -H "@$work/auth-header" -H 'x-ms-version: 2021-08-06' \
    -o "$3" "$1" || return 1
  echo "$2  $3" | sha256sum --check --status
}

# usage: download_patiently URL SHA256 FILE
download_patiently() {
  local attempt=1 delay
  until download "$@"; do
    if ((attempt >= ATTEMPTS)); then
      log "giving up after $attempt attempts to download $1 (or its SHA-256 never matched)"
      exit 1
    fi
    delay=$((attempt < 6 ? attempt * 5 : 30))
    log "download attempt $attempt of $1 failed; retrying in ${delay}s"
    sleep "$delay"
    attempt=$((attempt + 1))
  done
}

download_patiently "$BINARY_URL" "$BINARY_SHA256" "$work/worker"
install -D -m 0755 -o root -g root "$work/worker" "$DEST"

if [[ -n "$BUNDLE_URL" ]]; then
  download_patiently "$BUNDLE_URL" "$BUNDLE_SHA256" "$work/bundle.tar.gz"
  # Unpacked beside, then swapped in: the unit never sees half a bundle.
  rm -rf "$APP.new"
  mkdir -p "$APP.new"
  tar -xzf "$work/bundle.tar.gz" -C "$APP.new" --no-same-owner
  # Root's files, readable (and runnable where marked) by the service's
  # dynamic user, writable by nobody else.
  chmod -R a+rX,go-w "$APP.new"
  rm -rf "$APP"
  mv "$APP.new" "$APP"
  log "unpacked the bundle (sha256 $BUNDLE_SHA256) into $APP"
fi
if [[ -n "$ROOT" ]]; then
  log "installed $DEST (sha256 $BINARY_SHA256); install root set, so the service is left alone"
  exit 0
fi
systemctl daemon-reload
systemctl enable --now spot-worker.service
log "installed $DEST (sha256 $BINARY_SHA256) and started spot-worker.service"
