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

import copy
import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
STANDIN = HERE / "standin.py"
DOCS = ROOT / "docs" / "deploying.md"
# The block of docs/deploying.md that is the manual path: the ```sh azure
# fence right after this marker line.
MANUAL_MARKER = "<!-- rehearsed: manual scale-set path -->"
# Files a scenario can read, copied for each run so a planted mistake never
# touches the real ones.
COPIED = ("scripts", "bicep", "deploy", "docs")

ACCOUNT = "spotworkerabc123"
SCALER = "00000000-0000-0000-0000-00000000000c"
CONNECTION = ("InstrumentationKey=00000000-0000-0000-0000-000000000002;"
              "IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/")


def fresh_world() -> dict[str, Any]:
    """A subscription with nothing deployed yet, and what it will deploy."""
    return {
        "account": {"id": "00000000-0000-0000-0000-0000000000aa", "name": "rehearsal",
                    "tenantId": "00000000-0000-0000-0000-000000000003",
                    "user": {"name": "operator@example.com", "type": "user"}},
        "signed_in_user": {"id": "00000000-0000-0000-0000-0000000000bb"},
        "service_principal": {"id": "00000000-0000-0000-0000-0000000000cc"},
        "features": {"Microsoft.Compute/EncryptionAtHost": "Registered",
                     "Microsoft.Compute/FlexVMScaleSetSkuProfileEnabled": "Registered"},
        "resource_group": None,
        "deployments": {},
        "outputs": {
            "scale set": {
                "storageAccountName": ACCOUNT, "blobEndpoint": f"https://{ACCOUNT}.blob.core.windows.net/",
                "queueEndpoint": f"https://{ACCOUNT}.queue.core.windows.net/", "queueName": "jobs",
                "artifactsContainer": "artifacts", "resultsContainer": "results",
                "workerBinaryName": "spot-worker-primes", "workerBundleName": "",
                "vmssName": "spotworker-vmss", "appInsightsName": "spotworker-ai", "natPublicIp": "198.51.100.9"},
            "aks": {
                "clusterName": "spotworker-aks", "storageAccountName": ACCOUNT,
                "blobEndpoint": f"https://{ACCOUNT}.blob.core.windows.net/",
                "queueEndpoint": f"https://{ACCOUNT}.queue.core.windows.net/", "queueName": "jobs",
                "resultsContainer": "results", "workerClientId": "00000000-0000-0000-0000-000000000001",
                "scalerClientId": SCALER, "tenantId": "00000000-0000-0000-0000-000000000003",
                "appInsightsName": "spotworker-ai"},
        },
        "scale_set": {"name": "spotworker-vmss", "exists": False, "capacity": 0},
        "blobs": {},
        "evicted": [],
        "connection_string": CONNECTION,
        "cluster": {
            "exists": False, "kubeconfig": None, "attached_registries": [], "objects": {},
            "replicas": None, "telemetry_secret": None, "events": [], "restarts": 0,
            # The add-on's operator as it may come up when the add-on and
            # workload identity are enabled in one PUT: no identity yet.
            "keda_sa_annotations": {}, "keda_pods": [{"name": "keda-operator-first", "env": {"WATCH_NAMESPACE": ""}}],
            "webhook": True, "scaler_role": True, "keda_reports_not_ready": False,
        },
        "violations": [],
    }


@dataclasses.dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    calls: list[dict[str, Any]]
    world: dict[str, Any]

    def steps(self) -> list[str]:
        return [f"{c['tool']} {c.get('command', '?')}" for c in self.calls]


class Sandbox:
    """A copy of the repository's deploy files, a bin directory of stand-ins
    and a model of the subscription."""

    def __init__(self, base: pathlib.Path, mutate: Callable[[pathlib.Path], None] | None = None) -> None:
        self.root = base / "repo"
        for name in COPIED:
            shutil.copytree(ROOT / name, self.root / name)
        if mutate:
            mutate(self.root)
        self.home = base / "home"
        (self.home / ".ssh").mkdir(parents=True)
        (self.home / ".ssh" / "id_ed25519.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIrehearsal operator\n")
        self.binary = base / "my-worker"
        self.binary.write_bytes(b"\x7fELF rehearsal worker\n")
        self.binary.chmod(0o755)
        # The manual path names the release build: a stand-in file of its own.
        release = self.root / "target" / "release" / "examples" / "primes"
        release.parent.mkdir(parents=True)
        shutil.copy(self.binary, release)
        self.state = base / "state"
        self.state.mkdir()
        self.bin = base / "bin"
        self.bin.mkdir()
        for tool in ("az", "kubectl", "kubelogin"):
            self.wrapper(tool, f'exec "{sys.executable}" "{STANDIN}" {tool} "$@"')
        self.wrapper("sleep", f'echo "{{\\"tool\\": \\"sleep\\", \\"command\\": \\"$1\\", \\"argv\\": [\\"$1\\"]}}" >>"{self.state}/calls.jsonl"')
        self.wrapper("curl", 'echo "curl: the rehearsal is offline" >&2; exit 7')
        self.world = fresh_world()

    def wrapper(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)

    def run(self, argv: list[str], env: dict[str, str] | None = None, script: str | None = None) -> Run:
        (self.state / "world.json").write_text(json.dumps(self.world))
        (self.state / "calls.jsonl").write_text("")
        environment = {
            "PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.home),
            "REHEARSAL_STATE": str(self.state), "REHEARSAL_ROOT": str(self.root),
            "LANG": "C.UTF-8", "OPERATOR_IP": "203.0.113.7/32",
        }
        environment.update(env or {})
        result = subprocess.run(argv, cwd=self.root, env=environment, input=script, capture_output=True,
                                text=True, timeout=300, check=False)
        calls = [json.loads(line) for line in (self.state / "calls.jsonl").read_text().splitlines() if line]
        self.world = json.loads((self.state / "world.json").read_text())
        return Run(result.returncode, result.stdout, result.stderr, calls, self.world)


# -- what each scenario must show ----------------------------------------------


def opts(call: dict[str, Any]) -> list[str]:
    return call["argv"]


def param(call: dict[str, Any], name: str) -> str | None:
    argv = call["argv"]
    for token in argv:
        if token.startswith(f"{name}="):
            return token.split("=", 1)[1]
    return None


def common_problems(run: Run) -> list[str]:
    problems = [f"refused: {c['tool']} {' '.join(c['argv'])}: {c['refused']}" for c in run.calls if "refused" in c]
    problems += [f"platform rule broken: {v}" for v in run.world["violations"]]
    for c in run.calls:
        if CONNECTION in " ".join(c["argv"]):
            problems.append(f"the connection string is an argument of {c['tool']} {c.get('command')}")
    if CONNECTION in run.stdout + run.stderr:
        problems.append("the connection string was printed")
    return problems


def expect_sequence(run: Run, expected: list[str]) -> list[str]:
    got = run.steps()
    if got != expected:
        return [f"steps differ:\n      expected {expected}\n      got      {got}\n      stderr: {run.stderr[-1500:]}"]
    return []


def succeeded(run: Run) -> list[str]:
    return [] if run.code == 0 else [f"exit {run.code}: {run.stderr.strip()[-1500:]}"]


def creates(run: Run) -> list[dict[str, Any]]:
    return [c for c in run.calls if c.get("command") == "deployment group create"]


SCALE_SET_FIRST = [
    "az account show", "az feature show", "az feature show", "az group create", "az ad signed-in-user show",
    "az vmss list", "az deployment group show", "az deployment group create",
    "az deployment group show", "az deployment group show", "az deployment group show",
    "az storage blob upload", "az deployment group create",
    "az deployment group show", "az deployment group show", "az deployment group show",
]


def scale_set_env(box: Sandbox) -> dict[str, str]:
    return {"WORKER_BINARY": str(box.binary)}


def check_deploy_first(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "scripts/deploy.sh"], scale_set_env(box))
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, SCALE_SET_FIRST)
    if problems:
        return run, problems
    first, full = creates(run)
    sha = hashlib.sha256(box.binary.read_bytes()).hexdigest()
    wanted = {"deployCompute": "false", "operatorIpRanges": '["203.0.113.7"]', "workerBinarySha256": sha,
              "operatorPrincipalId": box.world["signed_in_user"]["id"], "operatorPrincipalType": "User"}
    problems += [f"first deployment: {k}={param(first, k)!r}, want {v!r}" for k, v in wanted.items() if param(first, k) != v]
    wanted.update(deployCompute="true", currentInstanceCount="0")
    problems += [f"full deployment: {k}={param(full, k)!r}, want {v!r}" for k, v in wanted.items() if param(full, k) != v]
    if run.world["blobs"].get("my-worker") != sha or param(full, "workerBinaryName") != "my-worker":
        problems.append("the worker binary was not uploaded as my-worker, the blob the scale set is told to fetch")
    if "--vmss spotworker-vmss" not in run.stderr:
        problems.append("the closing hint does not list the workers with az vm list --vmss")
    return run, problems


def check_deploy_again(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["scale_set"]["capacity"] = 4  # autoscale added workers since
    run = box.run(["bash", "scripts/deploy.sh"], scale_set_env(box))
    expected = SCALE_SET_FIRST[:12] + ["az vmss show"] + SCALE_SET_FIRST[12:]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    if not problems and param(creates(run)[1], "currentInstanceCount") != "4":
        problems.append("the re-deploy did not keep the 4 running instances")
    return run, problems


def check_eviction(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "scripts/simulate-eviction.sh"])
    problems = succeeded(run) + common_problems(run) + expect_sequence(
        run, ["az account show", "az deployment group show", "az vm list", "az vm simulate-eviction"])
    if not problems and run.world["evicted"] != ["spotworker-vmss_00000000"]:
        problems.append(f"evicted {run.world['evicted']}, want the scale set's first VM")
    return run, problems


def check_operator_range(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "scripts/deploy.sh"], {**scale_set_env(box), "OPERATOR_IP": "203.0.113.6/31"})
    problems = common_problems(run)
    if run.code == 0 or "not /31 ranges" not in run.stderr:
        problems.append(f"OPERATOR_IP=.../31 was not refused with a clear message: exit {run.code}, {run.stderr[-300:]}")
    if creates(run):
        problems.append("a deployment ran although OPERATOR_IP was refused")
    return run, problems


def aks_steps(first: bool, checks: int) -> list[str]:
    steps = ["az account show", "az group create", "az ad signed-in-user show", "az deployment group create",
             "az deployment group show", "az aks update", "az aks get-credentials", "kubelogin convert-kubeconfig"]
    steps += ["az deployment group show"] * 7
    steps += ["kubectl get"]  # the keda-operator service account's annotation
    if first:
        steps += ["kubectl annotate", "kubectl rollout restart", "kubectl rollout status", "kubectl get"]
    else:
        steps += ["kubectl get"]  # its pods already have the token
    steps += ["kubectl apply", "az resource show", "kubectl apply", "kubectl apply", "kubectl apply", "kubectl apply"]
    for check in range(1, checks + 1):
        steps += ["kubectl get", "kubectl get"]
        if check < checks:
            steps += ["sleep 5"]
    return steps


AKS_ENV = {"IMAGE": "myregistry.azurecr.io/spot-worker:1", "ACR_NAME": "myregistry"}


def applied(run: Run, kind: str) -> dict[str, Any] | None:
    import yaml

    for call in run.calls:
        for doc in yaml.safe_load_all(call.get("stdin") or ""):
            if doc and doc.get("kind") == kind:
                return doc
    return None


def check_aks_first(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "scripts/deploy-aks.sh"], AKS_ENV)
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, aks_steps(True, 7))
    if problems:
        return run, problems
    (deployment,) = creates(run)
    wanted = {"namespace": "spot-worker", "operatorIpRanges": '["203.0.113.7"]',
              "operatorPrincipalId": box.world["signed_in_user"]["id"]}
    problems += [f"AKS deployment: {k}={param(deployment, k)!r}, want {v!r}"
                 for k, v in wanted.items() if param(deployment, k) != v]
    if "--template-file" not in opts(deployment) or "bicep/aks/main.bicep" not in opts(deployment):
        problems.append("the AKS deployment does not deploy bicep/aks/main.bicep")
    if run.world["cluster"]["attached_registries"] != ["myregistry"]:
        problems.append(f"registries attached: {run.world['cluster']['attached_registries']}, want ACR_NAME")
    image = (applied(run, "Deployment") or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0].get("image")
    if image != AKS_ENV["IMAGE"]:
        problems.append(f"the Deployment applied runs {image!r}, want IMAGE")
    annotate = next(c for c in run.calls if c.get("command") == "annotate")
    if f"azure.workload.identity/client-id={SCALER}" not in annotate["argv"]:
        problems.append(f"keda-operator annotated with {annotate['argv']}, want the scaler's client id")
    containers = (applied(run, "Deployment") or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])
    ref = next((e["valueFrom"]["secretKeyRef"] for e in containers[0].get("env", [])
                if e.get("name") == "APPLICATIONINSIGHTS_CONNECTION_STRING" and "valueFrom" in e), {})
    secret = applied(run, "Secret") or {}
    if (secret.get("metadata", {}).get("name") != ref.get("name")
            or secret.get("stringData", {}).get(ref.get("key")) != CONNECTION):
        problems.append(f"the Deployment reads the telemetry Secret {ref}, which the script did not create "
                        "with Application Insights' connection string")
    trigger = (applied(run, "ScaledObject") or {}).get("spec", {}).get("triggers", [{}])[0].get("metadata", {})
    if trigger.get("queueLengthStrategy") != "all":
        problems.append("the ScaledObject applied does not count leased messages")
    if "READY=True ACTIVE=False" not in run.stderr:
        problems.append("the ScaledObject's READY/ACTIVE conditions were not reported")
    return run, problems


def check_aks_again(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["cluster"]["replicas"] = 3  # KEDA scaled the workers out since
    box.world["cluster"]["keda_looks"] = 0
    run = box.run(["bash", "scripts/deploy-aks.sh"], AKS_ENV)
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, aks_steps(False, 7))
    if run.world["cluster"]["replicas"] != 3:
        problems.append(f"the re-run changed the running workers from 3 to {run.world['cluster']['replicas']}")
    return run, problems


def check_aks_no_identity(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["cluster"]["webhook"] = False
    run = box.run(["bash", "scripts/deploy-aks.sh"], AKS_ENV)
    problems = [f"refused: {c['refused']}" for c in run.calls if "refused" in c]
    if run.code == 0 or "AZURE_FEDERATED_TOKEN_FILE" not in run.stderr:
        problems.append(f"operator pods without the token did not stop the deployment: exit {run.code}, {run.stderr[-300:]}")
    if any(c.get("command") == "apply" for c in run.calls):
        problems.append("manifests were applied although KEDA has no identity")
    return run, problems


def check_aks_no_role(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["cluster"].update(scaler_role=False, keda_reports_not_ready=True)
    run = box.run(["bash", "scripts/deploy-aks.sh"], AKS_ENV)
    problems = [f"refused: {c['refused']}" for c in run.calls if "refused" in c]
    if run.code == 0 or "403 AuthorizationPermissionMismatch" not in run.stderr or "READY=False" not in run.stderr:
        problems.append(f"a scaler that cannot read the queue did not fail with KEDA's message: exit {run.code}, {run.stderr[-400:]}")
    return run, problems


def manual_path(root: pathlib.Path) -> str:
    text = (root / "docs" / "deploying.md").read_text()
    at = text.find(MANUAL_MARKER)
    if at < 0:
        raise SystemExit(f"docs/deploying.md has no {MANUAL_MARKER}")
    match = re.compile(r"```sh azure\n(.*?)```", re.S).search(text, at)
    if not match:
        raise SystemExit("docs/deploying.md: no ```sh azure block after the manual-path marker")
    return match.group(1)


MANUAL_STEPS = ["az group create", "az ad signed-in-user show", "az deployment group create",
                "az deployment group show", "az storage blob upload", "az vmss list"]


def check_manual(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "-euo", "pipefail"], {"OPERATOR_IP": "203.0.113.7"}, script=manual_path(box.root))
    expected = MANUAL_STEPS + ["az deployment group create"]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    if not problems:
        first, full = creates(run)
        if param(first, "deployCompute") != "false" or param(full, "currentInstanceCount") != "0":
            problems.append("the manual path does not deploy without compute first, then with currentInstanceCount")
        if param(first, "operatorPrincipalId") is None:
            problems.append("the manual path does not pass operatorPrincipalId")
    return run, problems


def check_manual_again(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["scale_set"]["capacity"] = 4
    run = box.run(["bash", "-euo", "pipefail"], {"OPERATOR_IP": "203.0.113.7"}, script=manual_path(box.root))
    expected = MANUAL_STEPS + ["az vmss show", "az deployment group create"]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    return run, problems


# (name, scenarios run in order on one sandbox): later ones build on the world
# the earlier ones left.
SCENARIOS: list[tuple[str, list[tuple[str, Callable[[Sandbox], tuple[Run, list[str]]]]]]] = [
    ("scale set", [("deploy.sh, first", check_deploy_first), ("deploy.sh, again", check_deploy_again),
                   ("simulate-eviction.sh", check_eviction)]),
    ("operator range", [("deploy.sh, OPERATOR_IP /31", check_operator_range)]),
    ("AKS", [("deploy-aks.sh, first", check_aks_first), ("deploy-aks.sh, again", check_aks_again)]),
    ("AKS without workload identity", [("deploy-aks.sh, no token for KEDA", check_aks_no_identity)]),
    ("AKS without the scaler's role", [("deploy-aks.sh, KEDA cannot read the queue", check_aks_no_role)]),
    ("manual path", [("docs/deploying.md manual path, first", check_manual),
                     ("docs/deploying.md manual path, again", check_manual_again)]),
]


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
    import shlex

    sys.path.insert(0, str(HERE))
    os.environ.setdefault("REHEARSAL_STATE", "/nonexistent")
    import standin

    problems = []
    commands = docs_az_commands(DOCS.read_text())
    for command in commands:
        try:
            standin.parse("az", shlex.split(command))
        except standin.Refused as refusal:
            problems.append(f"docs/deploying.md: az {command}: {refusal}")
    print(f"    docs/deploying.md: {len(commands)} az command lines checked against cli-spec.json")
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
    problems += docs_problems() + step_table_problems(measured)
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    if problems:
        print(f"{len(problems)} rehearsal check(s) failed", file=sys.stderr)
        return 1
    print("deploy rehearsal: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
