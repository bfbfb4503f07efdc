#!/usr/bin/env python3
"""The deploy rehearsal: scripts/deploy.sh, deploy-aks.sh, simulate-eviction.sh
and docs/deploying.md's manual scale-set path, run end to end (run by
scripts/test.sh; no Azure, no cluster).

The real scripts run unmodified with recording stand-ins for `az`, `kubectl`
and `kubelogin` first on PATH (standin.py: they accept only the commands and
options the real tools have, per cli-spec.json, and answer in the real tools'
shapes from a model of the subscription and cluster), plus `sleep` (recorded,
returns at once) and `curl` (refused: the rehearsal is offline). Each
scenario checks the whole sequence of calls, the arguments that matter, the
model's end state and that no platform rule was broken.

First a self-test: planted mistakes (PLANTED below: a rule of the platform or
of this project broken in a copy of the scripts) must each make a scenario
fail with the expected text. Then the scenarios on the real files. Prints
the number of steps (tool calls) of each scenario, as docs/deploying.md
quotes them (and fails if the table there says otherwise).

Runs with tools/infra/.venv's Python: the stand-ins use its jmespath (az's
--query) and PyYAML, both pinned in tools/infra/requirements.txt.
"""
from __future__ import annotations

import pathlib
import re
import shlex
import sys
import tempfile
from typing import Callable

import cli_spec
from sandbox import DOCS, Sandbox
from scenarios import SCENARIOS


def replace(path: str, old: str, new: str) -> Callable[[pathlib.Path], None]:
    def mutate(root: pathlib.Path) -> None:
        file = root / path
        text = file.read_text()
        if old not in text:
            raise SystemExit(f"planted mistake: {path} no longer contains {old!r}: update PLANTED")
        file.write_text(text.replace(old, new, 1))
    return mutate


def both(*mutations: Callable[[pathlib.Path], None]) -> Callable[[pathlib.Path], None]:
    def mutate(root: pathlib.Path) -> None:
        for mutation in mutations:
            mutation(root)
    return mutate


# Each planted mistake, the scenario group that must catch it and text its
# failure must contain.
PLANTED = [
    ("replicas in the Deployment", replace("deploy/kubernetes/deployment.yaml", "  selector:\n", "  replicas: 0\n  selector:\n"),
     "AKS", "the re-run changed the running workers from 3 to 0"),
    ("KEDA's service account not annotated",
     replace("scripts/deploy-aks.sh", "  kubectl annotate serviceaccount keda-operator", "  : kubectl annotate serviceaccount keda-operator"),
     "AKS", "AZURE_FEDERATED_TOKEN_FILE"),
    ("no kubelogin conversion", replace("scripts/deploy-aks.sh", "kubelogin convert-kubeconfig -l azurecli\n", "\n"),
     "AKS", "kubectl would wait for a device-code sign-in"),
    ("the Uniform-only instance list", replace("scripts/simulate-eviction.sh", "az vm list --resource-group \"$RESOURCE_GROUP\" --vmss \"$VMSS\"",
                                                "az vmss list-instances --resource-group \"$RESOURCE_GROUP\" --name \"$VMSS\""),
     "scale set", "use 'az vm list' for Flexible orchestration"),
    ("an upload with keys", replace("scripts/deploy.sh", "az storage blob upload --auth-mode login", "az storage blob upload"),
     "scale set", "Key based authentication is not permitted"),
    ("an option az does not have", replace("scripts/deploy.sh", "--template-file bicep/main.bicep", "--template bicep/main.bicep"),
     "scale set", "has no option --template"),
    ("the re-deploy forgets the running count", replace("scripts/deploy.sh", 'currentInstanceCount="$CURRENT"', 'currentInstanceCount=0'),
     "scale set", "busy Spot VMs deleted without a Scheduled Event"),
    ("the re-deploy forgets the regular lane's count",
     replace("scripts/deploy.sh", 'currentRegularInstanceCount="$CURRENT_REGULAR"', 'currentRegularInstanceCount=0'),
     "scale set", "regular VMs running jobs with a deadline cut short"),
    ("/32 passed to the storage firewall", both(replace("scripts/lib-azure.sh", '  ip="${ip%/32}"\n', ""),
                                                replace("scripts/lib-azure.sh", "[12][0-9]|30", "[12][0-9]|3[0-2]")),
     "scale set", "/31 or /32 prefix sizes are not supported"),
    ("the manual path without deployCompute=false",
     replace("docs/deploying.md", '"${params[@]}" deployCompute=false', '"${params[@]}" deployCompute=true'),
     "manual path", "the scale set boots before the worker binary"),
]


def docs_az_commands(text: str) -> list[str]:
    """Every `az ...` command line in the ```sh azure blocks of a document."""
    commands = []
    for block in re.findall(r"```sh azure\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
            commands += [m.strip() for m in re.findall(r"(?<![\w-])az ([^)|;&<]*)", line)]
    return commands


def docs_problems() -> list[str]:
    """The az commands docs/deploying.md tells a reader to type exist, with those options."""
    problems = []
    commands = docs_az_commands(DOCS.read_text())
    for command in commands:
        try:
            cli_spec.parse("az", shlex.split(command))
        except cli_spec.Refused as refusal:
            problems.append(f"docs/deploying.md: az {command}: {refusal}")
    print(f"    docs/deploying.md: {len(commands)} az command lines checked against cli-spec.json")
    return problems


def spec_problems() -> list[str]:
    """cli-spec.json is what generate_spec.py writes for its lists of commands:
    a command added to the lists (or to the file by hand) without
    regenerating it from the real tools is an error."""
    import generate_spec

    problems = []
    for tool, wanted in (("az", generate_spec.AZ_COMMANDS), ("kubectl", generate_spec.KUBECTL_COMMANDS)):
        have = set(cli_spec.SPEC[tool]["commands"])
        if have != set(wanted):
            problems.append(f"cli-spec.json's {tool} commands {sorted(have ^ set(wanted))} differ from "
                            "generate_spec.py's list: regenerate it from the real tools")
    if not all(cli_spec.SPEC["provenance"].get(tool) for tool in ("az", "kubectl", "kubelogin")):
        problems.append("cli-spec.json does not say where each tool's commands come from")
    return problems


def step_table_problems(measured: dict[str, int]) -> list[str]:
    """docs/deploying.md's table of steps per scenario is the one measured."""
    table = dict(re.findall(r"^  \| ([^|`]+?) \| (\d+) \|$", DOCS.read_text(), re.M))
    documented = {name: int(count) for name, count in table.items()}
    if documented != measured:
        return [f"docs/deploying.md's steps per scenario {documented} differ from the rehearsal's {measured}"]
    return []


def run_group(group: str, base: pathlib.Path, mutate: Callable[[pathlib.Path], None] | None) -> tuple[list[str], list[tuple[str, int]]]:
    scenarios = dict(SCENARIOS)[group]
    box = Sandbox(base, mutate)
    problems: list[str] = []
    counts: list[tuple[str, int]] = []
    for name, check in scenarios:
        run, found = check(box)
        counts.append((name, len(run.calls)))
        problems += [f"{name}: {p}" for p in found]
        if found:
            break
    return problems, counts


def main() -> int:
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rehearsal-") as tmp:
        base = pathlib.Path(tmp)
        print("--> rehearsal, self-test: every planted mistake fails its scenario", flush=True)
        for i, (what, mutate, group, text) in enumerate(PLANTED):
            found, _ = run_group(group, base / f"planted-{i}", mutate)
            if any(text in line for line in found):
                print(f"    caught   {what}")
            else:
                problems.append(f"self-test: planted '{what}' was not caught with '{text}'; the rehearsal said: {found}")
        print("--> rehearsal of scripts/ and docs/deploying.md's manual path against the stand-ins", flush=True)
        measured: dict[str, int] = {}
        for i, (group, _) in enumerate(SCENARIOS):
            found, counts = run_group(group, base / f"real-{i}", None)
            problems += found
            for name, count in counts:
                print(f"    {name}: {count} steps")
                measured[name] = count
    problems += spec_problems() + docs_problems() + step_table_problems(measured)
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} rehearsal check(s) failed", file=sys.stderr)
        return 1
    print("deploy rehearsal: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
