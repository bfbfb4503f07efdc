#!/usr/bin/env python3
"""May the operator kubectl apply deploy/kubernetes/ on the AKS cluster?

With Azure RBAC for Kubernetes authorization, a request is allowed when a
role assigned to the caller holds the data action
`Microsoft.ContainerService/managedClusters/[<group>/]<resource>/<read|write|delete>`.
`kubectl apply` reads each object and then creates or patches it (read and
write); `kubectl get -w` of the pods reads them. This derives the data
actions from the manifests' kinds, takes the operator's role assignments on
the cluster from bicep/aks (a custom role's data actions from its
definition, a built-in role's from azure-roles/roles.json) and checks that
they cover every one. It also says, for each built-in AKS RBAC role, what it
would leave out, and a self-test plants a removed data action.

Not known offline: that AKS names the data actions of custom resources
(keda.sh) this way; check on a real cluster with
`kubectl auth can-i create scaledobjects.keda.sh -n spot-worker`.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

import yaml

import bicep_model
import permissions

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
AKS_MAIN = ROOT / "bicep" / "aks" / "main.bicep"
PREFIX = "Microsoft.ContainerService/managedClusters/"

# kind -> (API group, resource): every kind the manifests hold must be here.
KINDS = {
    "Namespace": ("", "namespaces"),
    "ServiceAccount": ("", "serviceaccounts"),
    "Deployment": ("apps", "deployments"),
    "ScaledObject": ("keda.sh", "scaledobjects"),
    "TriggerAuthentication": ("keda.sh", "triggerauthentications"),
    "Role": ("rbac.authorization.k8s.io", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "rolebindings"),
}
# `kubectl -n <namespace> get scaledobject,pods -w` (docs/deploying.md).
WATCHED = [("", "pods"), ("keda.sh", "scaledobjects")]
# What scripts/deploy-aks.sh does with kubectl beyond applying the
# manifests: (group, resource, verb, why). KEDA's operator in kube-system is
# annotated and restarted (serviceaccounts and deployments, covered by the
# kinds above), the telemetry Secret is applied, and KEDA's events are read
# when the ScaledObject is checked.
SCRIPT = [
    ("", "secrets", "read", "kubectl apply of the spot-worker-telemetry Secret"),
    ("", "secrets", "write", "kubectl apply of the spot-worker-telemetry Secret"),
    ("", "events", "read", "KEDA's KEDAScalerFailed events"),
    ("", "serviceaccounts", "write", "kubectl annotate serviceaccount keda-operator"),
    ("apps", "deployments", "write", "kubectl rollout restart deployment/keda-operator"),
]
BUILT_IN = [
    "Azure Kubernetes Service RBAC Reader",
    "Azure Kubernetes Service RBAC Writer",
    "Azure Kubernetes Service RBAC Admin",
    "Azure Kubernetes Service RBAC Cluster Admin",
]


def data_action(group: str, resource: str, verb: str) -> str:
    return f"{PREFIX}{group + '/' if group else ''}{resource}/{verb}"


def needed(problems: list[str]) -> list[str]:
    actions: list[str] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            kind = document.get("kind")
            if kind not in KINDS:
                problems.append(f"{path.relative_to(ROOT)}: kind {kind} is not in kubectl_permissions.KINDS")
                continue
            group, resource = KINDS[kind]
            actions += [data_action(group, resource, verb) for verb in ("read", "write")]
    actions += [data_action(group, resource, "read") for group, resource in WATCHED]
    actions += [data_action(group, resource, verb) for group, resource, verb, _ in SCRIPT]
    return sorted(set(actions))


def operator_roles(problems: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """The operator's roles on the cluster: (name, dataActions, notDataActions)."""
    main = bicep_model.load(AKS_MAIN)
    module = next((m for m in main.modules.values() if m.path.name == "operator-aks.bicep"), None)
    if module is None:
        problems.append("bicep/aks/main.bicep does not call modules/operator-aks.bicep")
        return []
    template = bicep_model.load(module.path)
    roles = {role["id"]: role for role in json.loads(permissions.ROLES.read_text())}
    found = []
    for symbol, resource in template.resources.items():
        if resource.type != "Microsoft.Authorization/roleAssignments":
            continue
        properties = resource.body["properties"]
        if properties.get("principalId") != "operatorPrincipalId" or resource.body.get("scope") != "cluster":
            problems.append(f"operator-aks.bicep:{symbol}: not an operator assignment on the cluster")
            continue
        role = properties["roleDefinitionId"]
        accessor = permissions._accessor(role)
        if accessor and accessor[1] == ["id"]:
            definition = template.resources[accessor[0]].body["properties"]
            block = definition["permissions"][0]
            data = block["dataActions"]
            data = template.variables[data] if isinstance(data, str) else data
            found.append((definition["roleName"], list(data), list(block.get("notDataActions", []))))
        else:
            role_id = template.variables[role["function"]["parameters"]["resource_name_1"]]
            built_in = roles[role_id]
            found.append((built_in["name"], built_in["dataActions"], built_in["notDataActions"]))
    return found


def uncovered(actions: list[str], roles: list[tuple[str, list[str], list[str]]]) -> list[str]:
    def allows(role: tuple[str, list[str], list[str]], action: str) -> bool:
        _, allow, deny = role
        return any(permissions.pattern_matches(p, action) for p in allow) and not any(
            permissions.pattern_matches(p, action) for p in deny)
    return [action for action in actions if not any(allows(role, action) for role in roles)]


def verify() -> list[str]:
    problems: list[str] = []
    actions = needed(problems)
    roles = operator_roles(problems)
    for action in uncovered(actions, roles):
        problems.append(f"the operator may not {action.removeprefix(PREFIX)} on the cluster: "
                        "kubectl apply of deploy/kubernetes/ would be Forbidden")
    # Planted: the custom role without the KEDA objects must be caught.
    planted = [(name, [a for a in allow if "keda.sh" not in a], deny) for name, allow, deny in roles]
    if not uncovered(actions, planted):
        problems.append("self-test: removing the KEDA data actions went unnoticed")
    all_roles = {role["name"]: role for role in json.loads(permissions.ROLES.read_text())}
    for name in BUILT_IN:
        role = all_roles[name]
        missing = uncovered(actions, [(name, role["dataActions"], role["notDataActions"])])
        extra = "everything else in the cluster too" if not missing else \
            ", ".join(a.removeprefix(PREFIX) for a in missing)
        print(f"    {name}: {'covers them, and ' + extra if not missing else 'would not allow ' + extra}")
    print(f"    the operator's roles on the cluster ({', '.join(r[0] for r in roles)}) cover "
          f"{len(actions)} data actions: {', '.join(a.removeprefix(PREFIX) for a in actions)}")
    return problems


if __name__ == "__main__":
    found = verify()
    for line in found:
        print(f"FAIL {line}", file=sys.stderr)
    sys.exit(1 if found else 0)
