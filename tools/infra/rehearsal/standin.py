#!/usr/bin/env python3
"""A recording stand-in for `az`, `kubectl` and `kubelogin` (the deploy rehearsal).

Called as `standin.py TOOL ARGS...` by the wrappers rehearse.py puts first on
PATH. Each call is
1. checked against cli-spec.json (generated from the real tools' --help): a
   command or option the real tool does not have is refused, exit 2, and the
   refusal recorded (so a script that swallows errors still fails the
   rehearsal);
2. recorded (argv, and stdin for `kubectl apply -f -`) in $REHEARSAL_STATE/calls.jsonl;
3. answered from a small model of the subscription and cluster
   ($REHEARSAL_STATE/world.json), in the shapes the real tools print: az
   applies --query with JMESPath and formats --output json/tsv/none as
   knack does; kubectl evaluates the subset of its JSONPath templates the
   scripts use (anything else is refused, not guessed).

The model holds the platform rules the scripts must respect, each one a
refusal or a recorded violation the rehearsal asserts on:
- the storage firewall takes single addresses, not /31 or /32 ranges;
- shared-key access is off: blob uploads need --auth-mode login;
- a deployment that sets a Flexible scale set's capacity below what runs
  deletes busy Spot VMs (no Scheduled Event): recorded as a violation;
- `az vmss list-instances` is for Uniform scale sets (az's help sends
  Flexible ones to `az vm list`): refused for the Flexible scale set;
- an Entra ID cluster's kubeconfig needs `kubelogin convert-kubeconfig`
  before kubectl can sign in without a prompt;
- `kubectl apply` of a Deployment with `replicas` sets the running count;
- KEDA's operator gets the workload identity token only in pods started after
  its service account names a client id; without it the ScaledObject's
  scaler fails with KEDA's "sources must contain at least one TokenCredential".
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import sys
from typing import Any

import jmespath
import yaml

HERE = pathlib.Path(__file__).resolve().parent
SPEC = json.loads((HERE / "cli-spec.json").read_text())
STATE = pathlib.Path(os.environ["REHEARSAL_STATE"])
ROOT = pathlib.Path(os.environ.get("REHEARSAL_ROOT", HERE.parents[2]))


class Refused(Exception):
    """The real tool would not accept this command line."""


class Failed(Exception):
    """The real tool runs it and fails (exit code, message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- the command line against the spec ---------------------------------------


def parse(tool: str, argv: list[str]) -> tuple[str, dict[str, list[str]], list[str]]:
    """(command, options by canonical name, positionals), or Refused."""
    spec = SPEC[tool]
    words = []
    for token in argv:
        if token.startswith("-"):
            break
        words.append(token)
    command = None
    for n in range(len(words), 0, -1):
        if " ".join(words[:n]) in spec["commands"]:
            command = " ".join(words[:n])
            break
    if command is None:
        raise Refused(f"{tool} has no command '{' '.join(words)}' (cli-spec.json)")
    known = {**spec["global"], **spec["commands"][command]["options"]}
    options: dict[str, list[str]] = {}
    positionals: list[str] = []
    rest = argv[len(command.split()):]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        if not token.startswith("-") or token == "-":
            if tool == "az":
                raise Refused(f"az {command} takes no positional argument '{token}'")
            positionals.append(token)
            continue
        name, eq, inline = token.partition("=")
        entry = known.get(name)
        if entry is None:
            raise Refused(f"{tool} {command} has no option {name} (cli-spec.json)")
        canonical = entry.get("alias_of", name)
        values = options.setdefault(canonical, [])
        if eq:
            values.append(inline)
        elif entry["value"]:
            start = i
            while i < len(rest) and (not rest[i].startswith("-") or rest[i] == "-"):
                i += 1
                if tool != "az":  # kubectl's options take one value
                    break
            # az's help does not tell a flag (--overwrite-existing) from an
            # option with an optional value (--overwrite [true|false]): an az
            # option takes the words that follow it, if any.
            if i == start and tool != "az":
                raise Refused(f"{tool} {command} {name} needs a value")
            values += rest[start:i]
        else:
            values.append("true")
    for name, entry in spec["commands"][command]["options"].items():
        if entry.get("required") and name not in options:
            raise Refused(f"{tool} {command}: {name} is required")
    return command, options, positionals


def one(options: dict[str, list[str]], name: str, default: str | None = None) -> str | None:
    values = options.get(name)
    return values[-1] if values else default


# -- az ----------------------------------------------------------------------


def bicep_params(template: pathlib.Path) -> set[str]:
    return set(re.findall(r"^param (\w+)", template.read_text(), re.M))


def deployment_parameters(options: dict[str, list[str]], template: pathlib.Path) -> dict[str, str]:
    params: dict[str, str] = {}
    names = bicep_params(template)
    for value in options.get("--parameters", []):
        if "=" in value and not value.endswith((".bicepparam", ".json")):
            key, _, v = value.partition("=")
            if key not in names:
                raise Failed(1, f"(InvalidTemplate) the template has no parameter '{key}'")
            params[key] = v
        elif not (ROOT / value).is_file():
            raise Failed(2, f"parameters file {value} not found")
    return params


def az_deploy(world: dict, options: dict[str, list[str]]) -> Any:
    template_arg = one(options, "--template-file")
    template = ROOT / template_arg
    if not template.is_file():
        raise Failed(2, f"template {template_arg} not found")
    params = deployment_parameters(options, template)
    for entry in json.loads(params.get("operatorIpRanges", "[]")):
        if re.search(r"/3[12]$", entry):
            raise Failed(1, f"(NetworkAclsValidationFailure) Validation of network acls failure: "
                            f"{entry}: small address ranges using /31 or /32 prefix sizes are not supported")
    name = one(options, "--name")
    if template_arg == "bicep/main.bicep":
        for required in ("sshPublicKey", "workerBinarySha256"):
            if not params.get(required):
                raise Failed(1, f"(InvalidTemplate) missing value for required parameter '{required}'")
        outputs = dict(world["outputs"]["scale set"])
        # Outputs that echo a parameter.
        for key in ("workerBinaryName", "workerBundleName", "queueName"):
            if key in params:
                outputs[key] = params[key]
        if params.get("deployCompute", "true") == "true":
            vmss = world["scale_set"]
            running = vmss["capacity"] if vmss["exists"] else 0
            minimum = int(params.get("minInstances", "1"))
            capacity = max(minimum, int(params.get("currentInstanceCount", "0")))
            if running > capacity:
                world["violations"].append(
                    f"deployment {name} set the scale set's capacity from {running} to {capacity}: "
                    f"{running - capacity} busy Spot VMs deleted without a Scheduled Event")
            vmss.update(exists=True, capacity=capacity)
            blob = params.get("workerBinaryName", "spot-worker-primes")
            if blob not in world["blobs"]:
                world["violations"].append(f"the scale set boots before the worker binary {blob} is uploaded")
        else:
            outputs["vmssName"] = ""
    else:
        outputs = dict(world["outputs"]["aks"])
        world["cluster"]["exists"] = True
    world["deployments"][name] = {"template": template_arg, "parameters": params, "outputs": outputs}
    return None


def az_vmss(world: dict) -> dict:
    vmss = world["scale_set"]
    group = world["resource_group"]
    return {
        "id": f"/subscriptions/{world['account']['id']}/resourceGroups/{group}/providers/"
              f"Microsoft.Compute/virtualMachineScaleSets/{vmss['name']}",
        "name": vmss["name"],
        "orchestrationMode": "Flexible",
        "sku": {"capacity": vmss["capacity"], "name": "Mix", "tier": None},
    }


def az_vms(world: dict) -> list[dict]:
    vmss = az_vmss(world)
    return [{"name": f"{vmss['name']}_{i:08x}", "virtualMachineScaleSet": {"id": vmss["id"]},
             "priority": "Spot"} for i in range(world["scale_set"]["capacity"])]


def az(world: dict, command: str, options: dict[str, list[str]]) -> Any:
    group = one(options, "--resource-group")
    if group is not None and command not in ("group create",) and group != world["resource_group"]:
        raise Failed(3, f"(ResourceGroupNotFound) Resource group '{group}' could not be found.")
    if command == "account show":
        return world["account"]
    if command == "ad signed-in-user show":
        if world["signed_in_user"] is None:
            raise Failed(1, "/me request is only valid with delegated authentication flow.")
        return world["signed_in_user"]
    if command == "ad sp show":
        return world["service_principal"]
    if command == "feature show":
        feature = f"{one(options, '--namespace')}/{one(options, '--name')}"
        return {"name": feature, "properties": {"state": world["features"].get(feature, "NotRegistered")}}
    if command == "group create":
        world["resource_group"] = one(options, "--name")
        return {"id": f"/subscriptions/{world['account']['id']}/resourceGroups/{world['resource_group']}",
                "location": one(options, "--location"), "name": world["resource_group"],
                "properties": {"provisioningState": "Succeeded"}}
    if command == "group delete":
        world["deleted"] = True
        return None
    if command == "deployment group create":
        return az_deploy(world, options)
    if command == "deployment group show":
        name = one(options, "--name")
        found = world["deployments"].get(name)
        if found is None:
            raise Failed(3, f"(DeploymentNotFound) Deployment '{name}' could not be found.")
        return {"name": name, "properties": {
            "provisioningState": "Succeeded",
            "outputs": {k: {"type": "String", "value": v} for k, v in found["outputs"].items()}}}
    if command == "vmss list":
        return [az_vmss(world)] if world["scale_set"]["exists"] else []
    if command == "vmss show":
        if not world["scale_set"]["exists"] or one(options, "--name") != world["scale_set"]["name"]:
            raise Failed(3, f"(ResourceNotFound) scale set {one(options, '--name')} not found")
        return az_vmss(world)
    if command == "vmss list-instances":
        raise Failed(1, "(stand-in) the scale set is Flexible: az's help for vmss list-instances "
                        "says to use 'az vm list' for Flexible orchestration")
    if command == "vm list":
        vms = az_vms(world) if world["scale_set"]["exists"] else []
        wanted = one(options, "--vmss")
        if wanted is not None:
            vms = [vm for vm in vms if wanted in (world["scale_set"]["name"], vm["virtualMachineScaleSet"]["id"])]
        return vms
    if command == "vm simulate-eviction":
        name = one(options, "--name")
        if name not in {vm["name"] for vm in az_vms(world)}:
            raise Failed(3, f"(ResourceNotFound) The Resource 'Microsoft.Compute/virtualMachines/{name}' was not found.")
        world["evicted"].append(name)
        return None
    if command == "storage blob upload":
        if one(options, "--auth-mode") != "login":
            raise Failed(1, "Key based authentication is not permitted on this storage account.")
        path = pathlib.Path(one(options, "--file"))
        if not path.is_file():
            raise Failed(1, f"[Errno 2] No such file or directory: '{path}'")
        world["blobs"][one(options, "--name")] = hashlib.sha256(path.read_bytes()).hexdigest()
        return {"etag": '"0x8DC0000000000"', "lastModified": "2026-01-01T00:00:00+00:00"}
    if command == "aks get-credentials":
        if not world["cluster"]["exists"]:
            raise Failed(3, "(ResourceNotFound) the managed cluster was not found")
        if "--admin" in options:
            raise Failed(1, "(BadRequest) Getting static credential is not allowed because this cluster is set to disable local accounts.")
        world["cluster"]["kubeconfig"] = "devicecode"
        return None
    if command == "aks update":
        world["cluster"]["attached_registries"].append(one(options, "--attach-acr"))
        return {"name": one(options, "--name")}
    if command == "resource show":
        if one(options, "--resource-type") != "Microsoft.Insights/components":
            raise Failed(3, "(ResourceNotFound) not modelled")
        return {"name": one(options, "--name"), "type": "microsoft.insights/components",
                "properties": {"ConnectionString": world["connection_string"]}}
    raise Failed(1, f"(stand-in) az {command} is in the spec but not modelled: extend standin.py")


def knack_tsv(result: Any) -> str:
    """knack's TSV output (knack/output.py, _TsvOutput)."""
    def obj(value: Any) -> str:
        if isinstance(value, list):
            return str(len(value))
        if isinstance(value, dict):
            return ""
        return value if isinstance(value, str) else str(value)

    lines = []
    for row in result if isinstance(result, list) else [result]:
        if isinstance(row, dict):
            lines.append("\t".join(obj(v) for _, v in sorted(row.items())))
        elif isinstance(row, list):
            lines.append("\t".join(obj(v) for v in row))
        elif isinstance(row, bool):
            lines.append(str(row).lower())
        else:
            lines.append(obj(row))
    return "".join(line + "\n" for line in lines)


def az_output(result: Any, options: dict[str, list[str]]) -> str:
    query = one(options, "--query")
    if query is not None:
        result = jmespath.search(query, result)
    if result is None:
        return ""
    output = one(options, "--output", "json")
    if output == "none":
        return ""
    if output == "tsv":
        return knack_tsv(result)
    if output == "json":
        return json.dumps(result, indent=2) + "\n"
    raise Failed(1, f"(stand-in) --output {output} is not modelled")


# -- kubectl -----------------------------------------------------------------


def k8s_objects(world: dict, kind: str, namespace: str) -> list[dict]:
    cluster = world["cluster"]
    if kind in ("pods", "pod"):
        if namespace != "kube-system":
            return []
        return [{"metadata": {"name": p["name"], "labels": {"app": "keda-operator"},
                              **({"deletionTimestamp": "2026-01-01T00:00:00Z"} if p.get("terminating") else {})},
                 "spec": {"containers": [{"name": "keda-operator",
                                          "env": [{"name": n, "value": v} for n, v in p["env"].items()]}]}}
                for p in cluster["keda_pods"]]
    if kind in ("serviceaccount", "serviceaccounts", "sa"):
        found = [o for o in cluster["objects"].values() if o["kind"] == "ServiceAccount"
                 and o["metadata"].get("namespace") == namespace]
        if namespace == "kube-system":  # the KEDA add-on's operator
            found.append({"kind": "ServiceAccount", "metadata": {
                "name": "keda-operator", "namespace": "kube-system",
                "annotations": cluster["keda_sa_annotations"]}})
        return found
    if kind in ("scaledobject", "scaledobjects"):
        found = [o for o in cluster["objects"].values() if o["kind"] == "ScaledObject"
                 and o["metadata"].get("namespace") == namespace]
        return [dict(o, status=keda_status(world, o)) for o in found]
    if kind in ("events", "event"):
        return [e for e in cluster["events"] if e["metadata"]["namespace"] == namespace]
    raise Failed(1, f'error: the server doesn\'t have a resource type "{kind}"')


def keda_status(world: dict, scaled: dict) -> dict:
    """What KEDA's operator reports: nothing on its first look, then Ready."""
    cluster = world["cluster"]
    cluster["keda_looks"] = cluster.get("keda_looks", 0) + 1
    if cluster["keda_looks"] == 1:
        return {}
    problem = keda_problem(world, scaled)
    if problem:
        ns = scaled["metadata"]["namespace"]
        if not any(e["reason"] == "KEDAScalerFailed" for e in cluster["events"]):
            cluster["events"].append({
                "metadata": {"namespace": ns}, "reason": "KEDAScalerFailed",
                "involvedObject": {"kind": "ScaledObject", "name": scaled["metadata"]["name"]},
                "lastTimestamp": "2099-01-01T00:00:00Z", "message": problem})
        if cluster.get("keda_reports_not_ready"):
            return {"conditions": [{"type": "Ready", "status": "False", "message": problem},
                                   {"type": "Active", "status": "False", "message": ""}]}
    return {"conditions": [{"type": "Ready", "status": "True", "message": "ScaledObject is defined correctly and is ready for scaling"},
                           {"type": "Active", "status": "False", "message": "Scaling is not performed because triggers are not active"}]}


def keda_problem(world: dict, scaled: dict) -> str:
    cluster = world["cluster"]
    live = [p for p in cluster["keda_pods"] if not p.get("terminating")]
    if not live or any("AZURE_FEDERATED_TOKEN_FILE" not in p["env"] for p in live):
        return "error resolving auth params: sources must contain at least one TokenCredential"
    (trigger,) = scaled["spec"]["triggers"]
    auth = cluster["objects"].get(("TriggerAuthentication", scaled["metadata"]["namespace"],
                                   trigger["authenticationRef"]["name"]))
    identity = (auth or {}).get("spec", {}).get("podIdentity", {}).get("identityId")
    if identity != world["outputs"]["aks"]["scalerClientId"] or any(
            p["env"].get("AZURE_CLIENT_ID") != identity for p in live):
        return "ChainedTokenCredential authentication failed: AADSTS70021: No matching federated identity record found"
    if not cluster["scaler_role"]:
        return ("GET https://{0}.queue.core.windows.net/{1}: 403 AuthorizationPermissionMismatch: This request is "
                "not authorized to perform this operation using this permission.").format(
                    trigger["metadata"]["accountName"], trigger["metadata"]["queueName"])
    if trigger["metadata"].get("queueLengthStrategy") != "all":
        world["violations"].append("the ScaledObject does not count leased messages (queueLengthStrategy)")
    return ""


def jsonpath(template: str, data: Any) -> str:
    """kubectl's JSONPath templates, the subset the scripts use: {.a.b},
    {.a[*].b}, {.a\\.b/c}, {range EXPR}...{end}, {"literal"}."""
    tokens = re.findall(r'\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}|([^{}]+)', template)
    out: list[str] = []

    def path(expr: str, context: Any) -> list[Any]:
        if not expr.startswith("."):
            raise Failed(1, f"(stand-in) JSONPath {{{expr}}} is outside the modelled subset")
        values = [context]
        for part in re.findall(r"((?:[^.\[\\]|\\.)+)|\[([^\]]*)\]", expr[1:]):
            key, index = part
            nxt = []
            for v in values:
                if key:
                    key_name = key.replace("\\.", ".")
                    if isinstance(v, dict) and key_name in v:
                        nxt.append(v[key_name])
                elif index == "*":
                    nxt += v if isinstance(v, list) else list(v.values()) if isinstance(v, dict) else []
                else:
                    raise Failed(1, f"(stand-in) JSONPath index [{index}] is outside the modelled subset")
            values = nxt
        return values

    def run(items: list[tuple[str, str]], context: Any) -> None:
        i = 0
        while i < len(items):
            block, text = items[i]
            i += 1
            if text:
                out.append(text)
            elif block.startswith("range "):
                depth, j = 1, i
                while depth:
                    if j >= len(items):
                        raise Failed(1, "error: unclosed range")
                    depth += items[j][0].startswith("range ") - (items[j][0] == "end")
                    j += 1
                for item in path(block[6:].strip(), context):
                    for v in item if isinstance(item, list) else [item]:
                        run(items[i:j - 1], v)
                i = j
            elif block.startswith('"'):
                out.append(json.loads(block))
            else:
                values = path(block, context)
                flat = [x for v in values for x in (v if isinstance(v, list) else [v])]
                out.append(" ".join(x if isinstance(x, str) else json.dumps(x) for x in flat))

    run(tokens, data)
    return "".join(out)


def kubectl_apply(world: dict, text: str) -> str:
    cluster = world["cluster"]
    lines = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        kind, meta = doc["kind"], doc["metadata"]
        ns = meta.get("namespace", "")
        if kind != "Namespace" and ("Namespace", "", ns) not in cluster["objects"]:
            raise Failed(1, f'Error from server (NotFound): namespaces "{ns}" not found')
        key = (kind, ns, meta["name"])
        existed = key in cluster["objects"]
        cluster["objects"][key] = doc
        if kind == "Deployment":
            replicas = doc["spec"].get("replicas")
            if replicas is not None:
                cluster["replicas"] = replicas
            elif not existed:
                cluster["replicas"] = 1
        if kind == "Secret" and meta["name"] == "spot-worker-telemetry":
            cluster["telemetry_secret"] = doc.get("stringData", {}).get("connection-string")
        group = {"Deployment": "deployment.apps", "ScaledObject": "scaledobject.keda.sh",
                 "TriggerAuthentication": "triggerauthentication.keda.sh"}.get(kind, kind.lower())
        lines.append(f"{group}/{meta['name']} {'configured' if existed else 'created'}")
    return "".join(line + "\n" for line in lines)


def kubectl(world: dict, command: str, options: dict[str, list[str]], positionals: list[str],
            stdin: str | None) -> str:
    cluster = world["cluster"]
    if cluster.get("kubeconfig") != "azurecli":
        raise Failed(1, "(stand-in) the kubeconfig of an Entra ID cluster was not converted with "
                        "kubelogin convert-kubeconfig: kubectl would wait for a device-code sign-in")
    namespace = one(options, "--namespace", "default")
    if command == "apply":
        if options.get("--filename") != ["-"]:
            raise Failed(1, "(stand-in) only apply -f - is modelled")
        return kubectl_apply(world, stdin or "")
    if command == "annotate":
        kind, name, *pairs = positionals
        if (kind, name, namespace) != ("serviceaccount", "keda-operator", "kube-system"):
            raise Failed(1, f"(stand-in) annotate {kind}/{name} is not modelled")
        for pair in pairs:
            key, _, value = pair.partition("=")
            current = cluster["keda_sa_annotations"].get(key)
            if current not in (None, value) and one(options, "--overwrite") != "true":
                raise Failed(1, f"error: --overwrite is false but found the following declared annotation(s): '{key}' already has a value ({current})")
            cluster["keda_sa_annotations"][key] = value
        return f"serviceaccount/{name} annotated\n"
    if command == "rollout restart":
        if positionals != ["deployment/keda-operator"] or namespace != "kube-system":
            raise Failed(1, f"(stand-in) rollout restart {positionals} is not modelled")
        # The workload identity webhook injects its variables into pods created
        # while the service account names a client id (and only then).
        client_id = cluster["keda_sa_annotations"].get("azure.workload.identity/client-id")
        env = {"WATCH_NAMESPACE": ""}
        if client_id and cluster["webhook"]:
            env.update(AZURE_CLIENT_ID=client_id, AZURE_TENANT_ID=world["outputs"]["aks"]["tenantId"],
                       AZURE_FEDERATED_TOKEN_FILE="/var/run/secrets/azure/tokens/azure-identity-token",
                       AZURE_AUTHORITY_HOST="https://login.microsoftonline.com/")
        cluster["keda_pods"] = [dict(p, terminating=True) for p in cluster["keda_pods"]] + [
            {"name": f"keda-operator-{cluster['restarts']:05d}", "env": env}]
        cluster["restarts"] += 1
        return "deployment.apps/keda-operator restarted\n"
    if command == "rollout status":
        cluster["keda_pods"] = [p for p in cluster["keda_pods"] if not p.get("terminating")]
        return 'deployment "keda-operator" successfully rolled out\n'
    if command == "get":
        kind, *names = positionals
        items = k8s_objects(world, kind, namespace)
        selector = one(options, "--selector")
        if selector is not None:
            key, _, value = selector.partition("=")
            items = [o for o in items if o["metadata"].get("labels", {}).get(key) == value]
        fields = one(options, "--field-selector")
        if fields is not None:
            for clause in fields.split(","):
                key, _, value = clause.partition("=")
                items = [o for o in items if jsonpath("{." + key + "}", o) == value]
        if names:
            items = [o for o in items if o["metadata"].get("name") == names[0]]
            if not items:
                raise Failed(1, f'Error from server (NotFound): {kind} "{names[0]}" not found')
            data: Any = items[0]
        else:
            data = {"apiVersion": "v1", "kind": "List", "items": items}
        output = one(options, "--output", "")
        if output.startswith("jsonpath="):
            return jsonpath(output[len("jsonpath="):], data)
        raise Failed(1, f"(stand-in) kubectl get -o {output!r} is not modelled")
    raise Failed(1, f"(stand-in) kubectl {command} is in the spec but not modelled: extend standin.py")


def kubelogin(world: dict, command: str, options: dict[str, list[str]]) -> str:
    if command == "convert-kubeconfig":
        if world["cluster"].get("kubeconfig") is None:
            raise Failed(1, "Error: no kubeconfig to convert (run az aks get-credentials first)")
        if one(options, "--login") != "azurecli":
            raise Failed(1, f"(stand-in) login mode {one(options, '--login')} would not use the az login")
        world["cluster"]["kubeconfig"] = "azurecli"
        return ""
    raise Failed(1, f"(stand-in) kubelogin {command} is not modelled")


# -- the call ----------------------------------------------------------------


def keyed(objects: dict) -> dict:
    return {tuple(k.split("|")): v for k, v in objects.items()}


def main() -> int:
    tool, argv = sys.argv[1], sys.argv[2:]
    world_path = STATE / "world.json"
    world = json.loads(world_path.read_text())
    world["cluster"]["objects"] = keyed(world["cluster"]["objects"])
    stdin = None
    record: dict[str, Any] = {"tool": tool, "argv": argv}
    try:
        command, options, positionals = parse(tool, argv)
        record["command"] = command
        if tool == "kubectl" and command == "apply":
            stdin = sys.stdin.read()
            record["stdin"] = stdin
        if tool == "az":
            text = az_output(az(world, command, options), options)
        elif tool == "kubectl":
            text = kubectl(world, command, options, positionals, stdin)
        else:
            text = kubelogin(world, command, options)
        code = 0
    except Refused as refusal:
        record["refused"] = str(refusal)
        text, code = "", 2
        sys.stderr.write(f"{tool}: error: {refusal}\n")
    except Failed as failure:
        record["failed"] = str(failure)
        text, code = "", failure.code
        sys.stderr.write(f"ERROR: {failure}\n" if tool == "az" else f"{failure}\n")
    record["exit"] = code
    world["cluster"]["objects"] = {"|".join(k): v for k, v in world["cluster"]["objects"].items()}
    world_path.write_text(json.dumps(world, indent=1))
    with open(STATE / "calls.jsonl", "a") as calls:
        calls.write(json.dumps(record) + "\n")
    sys.stdout.write(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
