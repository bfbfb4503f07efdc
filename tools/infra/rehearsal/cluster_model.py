"""The stand-in `kubectl` and `kubelogin`: a model of the AKS cluster (the
objects applied, the worker Deployment's replica count, the KEDA add-on's
operator, its service account and its view of the ScaledObject), answering
as kubectl does, JSONPath templates included (the subset the scripts use;
anything else is refused rather than guessed)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from cli_spec import Failed, one


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
    triggers = scaled["spec"]["triggers"]
    for trigger in triggers:
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
    if not any(t["metadata"].get("queueLengthStrategy") == "all" for t in triggers):
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
