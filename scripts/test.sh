#!/usr/bin/env bash
# The one command that runs every check on a fresh machine: it installs what
# the tests need, then runs formatting, lints and the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Tests only talk to loopback; never let a proxy setting reroute them.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"

# Installs a dependency only when its lockfile changed since the last
# install, so repeated runs are fast and a fresh machine gets everything.
# usage: install_if_changed LOCKFILE STAMP COMMAND...
install_if_changed() {
  local lockfile="$1" stamp="$2"
  shift 2
  local want
  want="$(sha256sum "$lockfile" | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return 0
  fi
  "$@"
  mkdir -p "$(dirname "$stamp")"
  echo "$want" >"$stamp"
}

install_azurite() {
  npm ci --prefix tools/azurite --no-audit --no-fund --loglevel=error
}

install_python_venv() {
  rm -rf tools/python/.venv
  "${PYTHON:-python3}" -m venv tools/python/.venv
  tools/python/.venv/bin/pip install --quiet --disable-pip-version-check -r tools/python/requirements.txt
  # requirements.txt pins the full resolved set; fail if anything else got
  # in (a new transitive dependency must be pinned too).
  if ! diff <(grep -Ev '^[[:space:]]*(#|$)' tools/python/requirements.txt | sort -f) \
    <(tools/python/.venv/bin/pip freeze --disable-pip-version-check | sort -f); then
    echo "tools/python/.venv differs from tools/python/requirements.txt (< pinned, > installed)" >&2
    rm -rf tools/python/.venv
    return 1
  fi
}

install_infra_venv() {
  rm -rf tools/infra/.venv
  "${PYTHON:-python3}" -m venv tools/infra/.venv
  tools/infra/.venv/bin/pip install --quiet --disable-pip-version-check -r tools/infra/requirements.txt
  if ! diff <(grep -Ev '^[[:space:]]*(#|$)' tools/infra/requirements.txt | sort -f) \
    <(tools/infra/.venv/bin/pip freeze --disable-pip-version-check | sort -f); then
    echo "tools/infra/.venv differs from tools/infra/requirements.txt (< pinned, > installed)" >&2
    rm -rf tools/infra/.venv
    return 1
  fi
}

# Debian packages installed only when their command is missing (CI runs as
# root; elsewhere sudo is used if present). usage: install_debian_tools
# PACKAGE:COMMAND...
install_debian_tools() {
  local missing=() pair
  for pair in "$@"; do
    command -v "${pair#*:}" >/dev/null || missing+=("${pair%%:*}")
  done
  ((${#missing[@]} == 0)) && return 0
  local sudo=()
  [[ "$(id -u)" == 0 ]] || sudo=(sudo)
  echo "    apt-get install ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The interpreter the venv is built from: a different Python (version or
# install) needs a fresh venv even when requirements.txt is unchanged.
python_identity() {
  "${PYTHON:-python3}" -c 'import platform, sys; print(sys.version.replace("\n", " "), platform.machine(), sys.executable)'
}

echo "==> Azurite (npm ci, pinned by tools/azurite/package-lock.json)"
install_if_changed tools/azurite/package-lock.json tools/azurite/node_modules/.installed-lock-sha256 install_azurite

# Python interop tests (crates/azure/tests/python_interop.rs) are on unless
# SPOT_WORKER_PYTHON_INTEROP=0; then the venv is not needed.
case "${SPOT_WORKER_PYTHON_INTEROP:-1}" in
  0 | false | disabled) echo "==> Python interop disabled" ;;
  *)
    echo "==> Python venv (tools/python/requirements.txt)"
    python_id="$(python_identity)"
    echo "    interpreter: $python_id"
    # The stamp covers the requirements and the interpreter.
    install_if_changed <(cat tools/python/requirements.txt && echo "python: $python_id") \
      tools/python/.venv/.installed-requirements-sha256 install_python_venv
    ;;
esac

# Infra checks of bicep/ and scripts/ (tools/infra/check_infra.py, checkov and
# ShellCheck) are on unless SPOT_WORKER_INFRA_CHECKS=0.
infra_checks="${SPOT_WORKER_INFRA_CHECKS:-1}"
case "$infra_checks" in
  0 | false | disabled) echo "==> infra checks disabled" ;;
  *)
    echo "==> Debian tools for the infra checks (cloud-init, systemd-analyze, shellcheck)"
    install_debian_tools cloud-init:cloud-init systemd:systemd-analyze shellcheck:shellcheck
    echo "==> infra venv (tools/infra/requirements.txt: pycep-parser, checkov)"
    python_id="$(python_identity)"
    install_if_changed <(cat tools/infra/requirements.txt && echo "python: $python_id") \
      tools/infra/.venv/.installed-requirements-sha256 install_infra_venv
    echo "==> KEDA's types for the manifest checks (npm ci, pinned by tools/infra/keda/package-lock.json)"
    install_if_changed tools/infra/keda/package-lock.json tools/infra/keda/node_modules/.installed-lock-sha256 \
      npm ci --prefix tools/infra/keda --no-audit --no-fund --loglevel=error
    ;;
esac

# tests/vm_in_a_box.rs builds a VM in network/mount/PID namespaces: it needs
# unshare and mount (util-linux, mount), ip (iproute2), openssl for its
# throwaway CA, and what install-worker.sh runs (curl, python3). Skipped
# with SPOT_WORKER_VM_IN_A_BOX=0.
case "${SPOT_WORKER_VM_IN_A_BOX:-1}" in
  0 | false | disabled) echo "==> VM-in-a-box rehearsal disabled" ;;
  *)
    echo "==> Debian tools for the VM-in-a-box rehearsal (unshare, mount, ip, openssl, curl, python3)"
    install_debian_tools util-linux:unshare mount:mount iproute2:ip openssl:openssl curl:curl \
      python3:python3 ca-certificates:update-ca-certificates
    ;;
esac

# tests/container_image.rs and tests/pod_in_a_box.rs build the container
# image (scripts/build-image.sh) and run it with podman (scripts/podman.sh:
# runc, cgroupfs, vfs, its own containers.conf). Required here (SPOT_WORKER_CONTAINER_TEST=1) so CI cannot
# skip them silently; SPOT_WORKER_CONTAINER_TEST=0 skips them.
case "${SPOT_WORKER_CONTAINER_TEST:-1}" in
  0 | false | disabled) echo "==> container image test disabled" ;;
  *)
    echo "==> Debian tools for the container image test (podman, runc)"
    install_debian_tools podman:podman runc:runc
    export SPOT_WORKER_CONTAINER_TEST=1
    ;;
esac

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

case "$infra_checks" in
  0 | false | disabled) ;;
  *)
    echo "==> infra: bicep parses and matches Azure's types, scale-in table, cloud-init schema, systemd-analyze verify, workbook"
    # The unit is verified with ExecStart at the real worker binary.
    cargo build --locked --example primes
    tools/infra/.venv/bin/python tools/infra/check_infra.py --worker-binary target/debug/examples/primes
    echo "==> infra: checkov (bicep/; every skip justified inline)"
    # --skip-download and BC_SKIP_MAPPING: offline, no Prisma Cloud calls.
    BC_SKIP_MAPPING=TRUE tools/infra/.venv/bin/checkov --directory bicep --framework bicep \
      --skip-download --quiet --compact
    echo "==> infra: deploy/kubernetes/ against the Kubernetes API schemas, KEDA's types and the worker's rules"
    tools/infra/.venv/bin/python tools/infra/check_manifests.py
    echo "==> infra: shellcheck scripts/"
    shellcheck -x scripts/*.sh
    echo "==> infra: deploy rehearsal (scripts/ and the manual path against az/kubectl/kubelogin stand-ins)"
    tools/infra/.venv/bin/python tools/infra/rehearsal/rehearse.py
    ;;
esac

# The README's install command, as a user runs it, into a throwaway root;
# CARGO_TARGET_DIR keeps its release build in this workspace's target/, so a
# second run only links again (the image's binaries are the `image`
# profile's, target/image, built by the container tests). Then the
# installed command itself: its version, its help, and a short demo (an
# eviction mid-job and the resumption, checked; about 2 s).
echo "==> cargo install --locked --path crates/cli (the README's command)"
install_root="$(mktemp -d)"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" \
  cargo install --locked --quiet --path crates/cli --root "$install_root"
PATH="$install_root/bin:$PATH" spot-worker --version
PATH="$install_root/bin:$PATH" spot-worker --help >/dev/null
PATH="$install_root/bin:$PATH" spot-worker demo --jobs 2 --size 400_000_000
rm -rf "$install_root"

echo "==> cargo test"
cargo test --workspace --all-targets --locked
cargo test --workspace --doc --locked
