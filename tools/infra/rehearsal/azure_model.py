"""The stand-in `az`: a model of one subscription's resource group (deployments
and their outputs, the Flexible Spot scale set, the artifacts container, the
cluster's existence), answering as azure-cli does (`--query` with JMESPath,
`--output` formatted as knack formats it) and holding the platform rules the
scripts must respect (standin.py lists them)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
from typing import Any

import jmespath

from cli_spec import Failed, one

HERE = pathlib.Path(__file__).resolve().parent
ROOT = pathlib.Path(os.environ.get("REHEARSAL_ROOT", HERE.parents[2]))


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
            if params.get("regularLane", "true") == "true":
                regular = world["regular_set"]
                running = regular["capacity"] if regular["exists"] else 0
                capacity = max(int(params.get("regularMinInstances", "0")),
                               int(params.get("currentRegularInstanceCount", "0")))
                if running > capacity:
                    world["violations"].append(
                        f"deployment {name} set the regular scale set's capacity from {running} to {capacity}: "
                        f"{running - capacity} regular VMs running jobs with a deadline cut short")
                regular.update(exists=True, capacity=capacity)
            else:
                outputs["regularVmssName"] = ""
                outputs["regularQueueName"] = ""
            blob = params.get("workerBinaryName", "spot-worker-primes")
            if blob not in world["blobs"]:
                world["violations"].append(f"the scale set boots before the worker binary {blob} is uploaded")
        else:
            outputs["vmssName"] = ""
            outputs["regularVmssName"] = ""
    else:
        outputs = dict(world["outputs"]["aks"])
        world["cluster"]["exists"] = True
    world["deployments"][name] = {"template": template_arg, "parameters": params, "outputs": outputs}
    return None


SETS = {"scale_set": "Spot", "regular_set": "Regular"}


def az_vmss(world: dict, which: str = "scale_set") -> dict:
    vmss = world[which]
    group = world["resource_group"]
    return {
        "id": f"/subscriptions/{world['account']['id']}/resourceGroups/{group}/providers/"
              f"Microsoft.Compute/virtualMachineScaleSets/{vmss['name']}",
        "name": vmss["name"],
        "orchestrationMode": "Flexible",
        "sku": {"capacity": vmss["capacity"], "name": "Mix", "tier": None},
    }


def existing_sets(world: dict) -> list[str]:
    return [which for which in SETS if world[which]["exists"]]


def az_vms(world: dict) -> list[dict]:
    vms = []
    for which in existing_sets(world):
        vmss = az_vmss(world, which)
        vms += [{"name": f"{vmss['name']}_{i:08x}", "virtualMachineScaleSet": {"id": vmss["id"]},
                 "priority": SETS[which]} for i in range(world[which]["capacity"])]
    return vms


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
        return [az_vmss(world, which) for which in existing_sets(world)]
    if command == "vmss show":
        for which in existing_sets(world):
            if one(options, "--name") == world[which]["name"]:
                return az_vmss(world, which)
        raise Failed(3, f"(ResourceNotFound) scale set {one(options, '--name')} not found")
    if command == "vmss list-instances":
        raise Failed(1, "(stand-in) the scale set is Flexible: az's help for vmss list-instances "
                        "says to use 'az vm list' for Flexible orchestration")
    if command == "vm list":
        vms = az_vms(world)
        wanted = one(options, "--vmss")
        if wanted is not None:
            vms = [vm for vm in vms if wanted == vm["virtualMachineScaleSet"]["id"]
                   or vm["virtualMachineScaleSet"]["id"].endswith(f"/{wanted}")]
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
