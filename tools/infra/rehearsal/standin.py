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

import json
import os
import pathlib
import sys
from typing import Any

from azure_model import az, az_output
from cli_spec import Failed, Refused, parse
from cluster_model import kubectl, kubelogin

STATE = pathlib.Path(os.environ["REHEARSAL_STATE"])


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
