#!/usr/bin/env python3
"""Writes cli-spec.json: the commands and options of `az`, `kubectl` and
`kubelogin` that the deploy rehearsal's stand-ins accept, taken from the real
tools' own `--help`, offline.

Run it again whenever a script starts to use another command:

    python3 -m venv /tmp/azcli && /tmp/azcli/bin/pip install azure-cli==2.91.0
    PATH=/tmp/azcli/bin:$PATH python3 tools/infra/rehearsal/generate_spec.py

`az <command> --help` answers without a login (azure-cli from PyPI);
`kubectl <command> --help` and `kubectl options` answer without a cluster
(whichever kubectl is on PATH: the one this spec was made with is named in
its provenance). kubelogin ships in no registry this project
can reach, so its one command is written down from its documentation
(KUBELOGIN below) and marked so. The rehearsal (rehearse.py) needs only the
committed cli-spec.json, not these tools.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SPEC = HERE / "cli-spec.json"

# Every az command the scripts and docs/deploying.md's ```sh azure blocks run.
AZ_COMMANDS = [
    "account show",
    "acr create",
    "acr login",
    "ad signed-in-user show",
    "ad sp show",
    "aks get-credentials",
    "aks update",
    "deployment group create",
    "deployment group show",
    "feature show",
    "group create",
    "group delete",
    "monitor autoscale show",
    "monitor metrics list",
    "resource show",
    "storage blob upload",
    "vm list",
    "vm simulate-eviction",
    "vmss list",
    "vmss list-instances",
    "vmss show",
]

KUBECTL_COMMANDS = [
    "annotate",
    "apply",
    "get",
    "rollout restart",
    "rollout status",
]

# kubelogin (github.com/Azure/kubelogin): not in any registry reachable here.
# From its documentation ("kubelogin convert-kubeconfig -l azurecli", the
# command AKS's "Use kubelogin" page gives for Azure CLI sign-in).
KUBELOGIN = {
    "source": "hand-written from kubelogin's documentation (Azure/kubelogin README, AKS 'Use kubelogin to authenticate'); no registry ships the binary",
    "commands": {
        "convert-kubeconfig": {
            "options": {"--login": {"value": True}, "-l": {"value": True, "alias_of": "--login"},
                        "--kubeconfig": {"value": True}, "--context": {"value": True}},
        },
    },
    "global": {},
}

AZ_OPTION = re.compile(r"^ {4}(-[^:]*?)\s*(?:\[[^\]]*\]\s*)*:")
KUBECTL_OPTION = re.compile(r"^\s+(?:(-\w), )?(--[\w-]+)=(.*):\s*$")


def run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()[:300]}")
    return result.stdout


def az_options(help_text: str) -> tuple[dict, dict]:
    """(the command's own options, the global ones) from `az ... --help`."""
    own: dict[str, dict] = {}
    glob: dict[str, dict] = {}
    section = ""
    for line in help_text.splitlines():
        if line and not line.startswith(" "):
            section = line.strip()
            continue
        match = AZ_OPTION.match(line)
        if not match or not section.endswith("Arguments"):
            continue
        names = [n for n in match.group(1).split() if n.startswith("-")]
        target = glob if section == "Global Arguments" else own
        required = "[Required]" in line
        for name in names:
            entry = {"value": name not in ("--help", "-h", "--debug", "--verbose", "--only-show-errors")}
            if name != names[0]:
                entry["alias_of"] = names[0]
            if required and name == names[0]:
                entry["required"] = True
            target[name] = entry
    return own, glob


def kubectl_options(help_text: str) -> dict:
    options: dict[str, dict] = {}
    for line in help_text.splitlines():
        match = KUBECTL_OPTION.match(line)
        if not match:
            continue
        short, long, default = match.groups()
        # Booleans print their default as true/false and take no separate value.
        entry = {"value": default not in ("true", "false")}
        options[long] = entry
        if short:
            options[short] = {**entry, "alias_of": long}
    return options


def package_of(command: str) -> str:
    """The Debian package that installed `command`, and its version, if any."""
    path = subprocess.run(["sh", "-c", f"command -v {command}"], capture_output=True, text=True).stdout.strip()
    owner = subprocess.run(["dpkg", "-S", path], capture_output=True, text=True)
    if owner.returncode != 0 or not path:
        return "not from a Debian package"
    package = owner.stdout.split(":", 1)[0]
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return f"Debian package {package} {version.stdout.strip()}"


def main() -> int:
    az_version = json.loads(run("az", "version", "--output", "json"))["azure-cli"]
    kubectl_version = json.loads(run("kubectl", "version", "--client", "--output", "json"))["clientVersion"]["gitVersion"]
    az: dict = {"commands": {}, "global": {}}
    for command in AZ_COMMANDS:
        own, glob = az_options(run("az", *command.split(), "--help"))
        if not own and not glob:
            raise SystemExit(f"az {command} --help listed no arguments: is it a command?")
        az["commands"][command] = {"options": own}
        az["global"].update(glob)
    kubectl: dict = {"commands": {}, "global": kubectl_options(run("kubectl", "options"))}
    for command in KUBECTL_COMMANDS:
        options = kubectl_options(run("kubectl", *command.split(), "--help"))
        if not options:
            raise SystemExit(f"kubectl {command} --help listed no options")
        kubectl["commands"][command] = {"options": options}
    spec = {
        "_comment": "Generated by tools/infra/rehearsal/generate_spec.py from the real tools' --help; do not edit by hand.",
        "provenance": {
            "az": f"azure-cli {az_version} (PyPI), `az <command> --help`",
            "kubectl": f"kubectl {kubectl_version} ({package_of('kubectl')}), `kubectl <command> --help` and `kubectl options`",
            "kubelogin": KUBELOGIN["source"],
            "generated": datetime.date.today().isoformat(),
        },
        "az": az,
        "kubectl": kubectl,
        "kubelogin": {"commands": KUBELOGIN["commands"], "global": KUBELOGIN["global"]},
    }
    SPEC.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SPEC.relative_to(HERE.parents[2])}: {len(az['commands'])} az and {len(kubectl['commands'])} kubectl commands")
    return 0


if __name__ == "__main__":
    sys.exit(main())
