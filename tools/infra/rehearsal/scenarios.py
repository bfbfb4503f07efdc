"""The rehearsal's scenarios: each runs a script (or docs/deploying.md's manual
path) in a sandbox and returns what it found wrong: the whole sequence of
calls, the arguments that matter, the model's end state, and every platform
rule the model saw broken."""

from __future__ import annotations

import hashlib
import pathlib
import re
from typing import Any, Callable

import yaml

from sandbox import CONNECTION, MANUAL_MARKER, SCALER, Run, Sandbox

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
    # The scale sets of an earlier deployment: the Spot lane's and the
    # regular lane's names in its outputs.
    "az vmss list", "az deployment group show", "az deployment group show", "az deployment group create",
    "az deployment group show", "az deployment group show", "az deployment group show",
    "az storage blob upload", "az deployment group create",
    "az deployment group show", "az deployment group show", "az deployment group show", "az deployment group show",
]
# Where a re-deploy reads the running counts: before the full deployment.
FULL_DEPLOY = 13


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
    wanted.update(deployCompute="true", currentInstanceCount="0", currentRegularInstanceCount="0")
    problems += [f"full deployment: {k}={param(full, k)!r}, want {v!r}" for k, v in wanted.items() if param(full, k) != v]
    if run.world["blobs"].get("my-worker") != sha or param(full, "workerBinaryName") != "my-worker":
        problems.append("the worker binary was not uploaded as my-worker, the blob the scale set is told to fetch")
    if "--vmss spotworker-vmss" not in run.stderr:
        problems.append("the closing hint does not list the workers with az vm list --vmss")
    return run, problems


def check_deploy_again(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["scale_set"]["capacity"] = 4  # autoscale added workers since
    box.world["regular_set"]["capacity"] = 2  # and two regular ones
    run = box.run(["bash", "scripts/deploy.sh"], scale_set_env(box))
    expected = SCALE_SET_FIRST[:FULL_DEPLOY] + ["az vmss show", "az vmss show"] + SCALE_SET_FIRST[FULL_DEPLOY:]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    if not problems and param(creates(run)[1], "currentInstanceCount") != "4":
        problems.append("the re-deploy did not keep the 4 running instances")
    if not problems and param(creates(run)[1], "currentRegularInstanceCount") != "2":
        problems.append("the re-deploy did not keep the 2 running regular instances")
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
    steps += ["az deployment group show"] * 8
    steps += ["kubectl get"]  # the keda-operator service account's annotation
    if first:
        steps += ["kubectl annotate", "kubectl rollout restart", "kubectl rollout status", "kubectl get"]
    else:
        steps += ["kubectl get"]  # its pods already have the token
    steps += ["kubectl apply", "az resource show", "kubectl apply", "kubectl apply", "kubectl apply", "kubectl apply"]
    steps += ["kubectl apply"]  # the pod-deletion-cost Role and its binding
    steps += ["kubectl apply"]  # the regular lane (regular.yaml)
    for _scaled_object in ("spot-worker", "spot-worker-regular"):
        for check in range(1, checks + 1):
            steps += ["kubectl get", "kubectl get"]
            if check < checks:
                steps += ["sleep 5"]
    return steps


AKS_ENV = {"IMAGE": "myregistry.azurecr.io/spot-worker:1", "ACR_NAME": "myregistry"}


def applied(run: Run, kind: str, name: str | None = None) -> dict[str, Any] | None:
    for call in run.calls:
        for doc in yaml.safe_load_all(call.get("stdin") or ""):
            if doc and doc.get("kind") == kind and name in (None, doc.get("metadata", {}).get("name")):
                return doc
    return None


def check_aks_first(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "scripts/deploy-aks.sh"], AKS_ENV)
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, aks_steps(True, 7))
    if problems:
        return run, problems
    (deployment,) = creates(run)
    wanted = {"namespace": "spot-worker", "operatorIpRanges": '["203.0.113.7"]',
              "operatorPrincipalId": box.world["signed_in_user"]["id"], "operatorPrincipalType": "User"}
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
    regular = applied(run, "ScaledObject", "spot-worker-regular")
    queues = {t["metadata"]["queueName"] for t in (regular or {}).get("spec", {}).get("triggers", [])}
    if queues != {"jobs", "jobs-regular"}:
        problems.append(f"the regular lane's ScaledObject reads the queues {sorted(queues)}, want the regular "
                        "one (its jobs) and the Spot one (the keeper's wake)")
    if "ScaledObject spot-worker-regular: READY=True" not in run.stderr:
        problems.append("the regular lane's ScaledObject was not waited for")
    return run, problems


def check_aks_service_principal(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["signed_in_user"] = None  # az logged in as a service principal, as in CI
    run = box.run(["bash", "scripts/deploy-aks.sh"], AKS_ENV)
    steps = aks_steps(True, 7)
    at = steps.index("az ad signed-in-user show") + 1
    expected = steps[:at] + ["az account show", "az ad sp show"] + steps[at:]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    if not problems:
        (deployment,) = creates(run)
        if (param(deployment, "operatorPrincipalId"), param(deployment, "operatorPrincipalType")) != (
                box.world["service_principal"]["id"], "ServicePrincipal"):
            problems.append("signed in as a service principal, the operator was not granted as one")
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
                "az deployment group show", "az storage blob upload"]


def check_manual(box: Sandbox) -> tuple[Run, list[str]]:
    run = box.run(["bash", "-euo", "pipefail"], {"OPERATOR_IP": "203.0.113.7"}, script=manual_path(box.root))
    expected = MANUAL_STEPS + ["az vmss list", "az vmss list", "az deployment group create"]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    if not problems:
        first, full = creates(run)
        if (param(first, "deployCompute") != "false" or param(full, "currentInstanceCount") != "0"
                or param(full, "currentRegularInstanceCount") != "0"):
            problems.append("the manual path does not deploy without compute first, then with currentInstanceCount")
        if param(first, "operatorPrincipalId") is None:
            problems.append("the manual path does not pass operatorPrincipalId")
    return run, problems


def check_manual_again(box: Sandbox) -> tuple[Run, list[str]]:
    box.world["scale_set"]["capacity"] = 4
    box.world["regular_set"]["capacity"] = 2
    run = box.run(["bash", "-euo", "pipefail"], {"OPERATOR_IP": "203.0.113.7"}, script=manual_path(box.root))
    expected = MANUAL_STEPS + ["az vmss list", "az vmss show", "az vmss list", "az vmss show",
                               "az deployment group create"]
    problems = succeeded(run) + common_problems(run) + expect_sequence(run, expected)
    if not problems:
        _, full = creates(run)
        if (param(full, "currentInstanceCount"), param(full, "currentRegularInstanceCount")) != ("4", "2"):
            problems.append("the manual path did not keep the 4 Spot and 2 regular instances running")
    return run, problems


# (name, scenarios run in order on one sandbox): later ones build on the world
# the earlier ones left.
SCENARIOS: list[tuple[str, list[tuple[str, Callable[[Sandbox], tuple[Run, list[str]]]]]]] = [
    ("scale set", [("deploy.sh, first", check_deploy_first), ("deploy.sh, again", check_deploy_again),
                   ("simulate-eviction.sh", check_eviction)]),
    ("operator range", [("deploy.sh, OPERATOR_IP /31", check_operator_range)]),
    ("AKS", [("deploy-aks.sh, first", check_aks_first), ("deploy-aks.sh, again", check_aks_again)]),
    ("AKS as a service principal", [("deploy-aks.sh, as a service principal", check_aks_service_principal)]),
    ("AKS without workload identity", [("deploy-aks.sh, no token for KEDA", check_aks_no_identity)]),
    ("AKS without the scaler's role", [("deploy-aks.sh, KEDA cannot read the queue", check_aks_no_role)]),
    ("manual path", [("docs/deploying.md manual path, first", check_manual),
                     ("docs/deploying.md manual path, again", check_manual_again)]),
]
