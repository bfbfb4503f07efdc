#!/usr/bin/env python3
"""Offline checks of bicep/ (run by scripts/test.sh; no Azure needed).

1. Every .bicep file parses with pycep-parser.
2. Templates against Azure's own types (tools/infra/azure-types, the Bicep
   compiler's type library): every resource body of main.bicep (the scale
   set), aks/main.bicep (AKS with a Spot pool) and the modules they reach (unknown, misplaced, read-only, missing required properties,
   wrong types, values outside enums and bounds), module wiring (params and
   outputs), and each .bicepparam against its template's parameters and their
   decorators, and every scale set's health extension probes the worker's
   liveness path /healthz, never /readyz (health_probe.py). First a
   self-test: the planted mistakes of tools/infra/fixtures/planted/ must
   each be reported, and nothing else.
3. The instance mix (vmSizes) has one local-disk configuration, and the
   autoscale rules (modules/autoscale.bicep) rendered for both settings of
   scaleInProtection and evaluated on a table of (backlog, in flight, busy
   VMs, instances) cases: without the workers' protection scale-in never
   removes an instance while any message is held; with it (the prompt rule)
   idle VMs go a step at a time, busy ones never, never below the minimum;
   a backlog scales out; one parameter drives the worker's setting on both
   scale sets, the role and the prompt rule (autoscale_model.py); the
   regular lane's too
   (modules/regular-autoscale.bicep, regular_autoscale.py): from zero, one
   VM to keep the lanes while no Spot VM runs, back to zero when idle.
4. The cloud-init document is rendered the way modules/compute.bicep renders
   it (its `var x = replace(...)` chain is evaluated literally, with sample
   values for the deployment's outputs) and nothing is left unfilled: twice,
   for the default worker binary and for the command path (`spot-worker run
   -- <command>` with an application bundle), whose ExecStart must carry the
   command with systemd's `%` and `$` escaped.
5. `cloud-init schema --config-file` accepts each rendered document.
6. The systemd unit cloud-init writes passes `systemd-analyze verify`, with
   ExecStart pointed at a real binary (--worker-binary) and EnvironmentFile at
   the rendered env file; the rendered install script passes ShellCheck.
7. The checkpoint container has a lifecycle rule deleting its blobs
   checkpointRetentionDays after their last write, and that parameter can
   never be below the queue messages' time-to-live plus the 3 days a
   checkpoint's chunks may age before a save, restore or move dates them
   anew.
8. The role assignments cover every storage operation each identity issues
   (permissions.py: recorded by tests/it/storage_permissions.rs), what each
   grants beyond use is reported, and docs/deploying.md's table is current;
   the operator's roles on the AKS cluster allow kubectl apply of
   deploy/kubernetes/ (kubectl_permissions.py).
9. The workbook is valid JSON, every spot_worker.* name it queries is a
   metric the telemetry crate defines, and the queue-depth panel says how
   often its metric is refreshed.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import yaml

import autoscale_model
import bicep_model
import bicep_types
import bicep_wiring
import health_probe
import kubectl_permissions
import permissions
import regular_autoscale
from findings import KINDS, Report

ROOT = pathlib.Path(__file__).resolve().parents[2]
BICEP = ROOT / "bicep"
COMPUTE = BICEP / "modules" / "compute.bicep"
# The telemetry crate's sources: the metrics and their names (names.rs,
# metrics.rs and the rest, wherever a module moves).
TELEMETRY_SRC = ROOT / "crates" / "telemetry" / "src"
TYPES = ROOT / "tools" / "infra" / "azure-types" / "bicep-types"
PLANTED = ROOT / "tools" / "infra" / "fixtures" / "planted"

# What the deployment would pass to modules/compute.bicep.
SAMPLE_PARAMS = {
    "storageBlobEndpoint": "https://spotworkerabc123.blob.core.windows.net/",
    "identityClientId": "00000000-0000-0000-0000-000000000001",
    "queueName": "jobs",
    "checkpointContainer": "checkpoints",
    "resultsContainer": "results",
    "appInsightsConnectionString": "InstrumentationKey=00000000-0000-0000-0000-000000000002;"
    "IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/",
    "workerBinaryUrl": "https://spotworkerabc123.blob.core.windows.net/artifacts/spot-worker-primes",
    "workerBinarySha256": "0" * 64,
    # The default: the binary is the worker, no bundle.
    "workerArgs": "",
    "workerBundleUrl": "",
    "workerBundleSha256": "",
    # The Spot lane's scale set, with the regular lane deployed (main.bicep's
    # default), one job per CPU.
    "lane": "spot",
    "regularQueueName": "jobs-regular",
    "concurrency": "",
    # main.bicep's default scaleInProtection: the worker protects its VM.
    "scaleInProtection": "on",
}

# The regular lane's scale set: the same worker, serving the regular queue,
# one job per VM.
REGULAR_PARAMS = {**SAMPLE_PARAMS, "lane": "regular", "concurrency": "1"}

# The command path: what main.bicep passes for workerCommand and a bundle.
# The command has a `%` and a `$`, which systemd must not expand.
COMMAND = 'python3 primes.py --label "100% of $HOME"'
COMMAND_PARAMS = {
    **SAMPLE_PARAMS,
    "workerArgs": f"run --job-key job_id --result-name {{job_key}}.json -- {COMMAND}",
    "workerBundleUrl": "https://spotworkerabc123.blob.core.windows.net/artifacts/app.tar.gz",
    "workerBundleSha256": "1" * 64,
}
COMMAND_EXEC_START = (
    "/opt/spot-worker/bin/worker run --job-key job_id --result-name {job_key}.json -- "
    'python3 primes.py --label "100%% of $$HOME"'
)

failures: list[str] = []


def fail(message: str) -> None:
    failures.append(message)
    print(f"FAIL {message}", file=sys.stderr)


def step(title: str):
    print(f"--> {title}", flush=True)
    return time.monotonic()


def done(started: float, detail: str = "") -> None:
    print(f"    ok ({time.monotonic() - started:.2f} s){' ' + detail if detail else ''}", flush=True)


def parse_bicep() -> None:
    started = step("pycep-parser: every .bicep file parses")
    files = sorted(BICEP.rglob("*.bicep"))
    if not files:
        fail("no .bicep files under bicep/")
    for path in files:
        try:
            bicep_model.load(path.resolve())
        except Exception as error:  # pycep raises lark errors of many kinds
            fail(f"{path.relative_to(ROOT)} does not parse: {str(error).splitlines()[0]}")
    done(started, f"{len(files)} files")


def check_templates_self_test(library: bicep_types.TypeLibrary) -> None:
    started = step("type checks, self-test: every planted mistake in tools/infra/fixtures/planted is reported")
    report = Report(ROOT)
    bicep_wiring.check_deployment(PLANTED / "main.bicepparam", library, report)
    expected = json.loads((PLANTED / "expected.json").read_text())["expected"]
    reported = [str(finding) for finding in report.findings]
    matched: set[int] = set()
    for kind, text in expected:
        hits = [i for i, line in enumerate(reported) if line.endswith(f"[{kind}]") and text in line]
        if hits:
            matched.update(hits)
            print(f"    caught   {kind:22} {text}")
        else:
            fail(f"self-test: the planted {kind} mistake '{text}' was not reported")
    for i, line in enumerate(reported):
        if i not in matched:
            fail(f"self-test: unexpected finding in the fixture: {line}")
    kinds = {kind for kind, _ in expected}
    for kind in KINDS:
        if kind not in kinds:
            fail(f"self-test: the fixture plants no {kind} mistake")
    done(started, f"{len(expected)} planted mistakes of {len(kinds)} kinds (of {len(KINDS)}) all reported")


# The deployments in bicep/, each checked from its parameter file: the
# scale set (main.bicepparam) and AKS (aks/main.bicepparam).
DEPLOYMENTS = ["main.bicepparam", "aks/main.bicepparam"]


def check_liveness_route() -> None:
    started = step(f"health probe: the worker still serves the liveness path the scale set probes ({health_probe.LIVENESS_PATH})")
    if not health_probe.liveness_route_served():
        fail(f"{health_probe.HEALTH_RS.relative_to(ROOT)} no longer serves {health_probe.LIVENESS_PATH}, "
             "which every scale set's health extension must probe")
    done(started)


def check_permissions() -> None:
    started = step("permissions: the roles bicep assigns cover every storage operation each identity issues")
    for problem in permissions.verify():
        fail(problem)
    done(started)
    started = step("permissions: the operator may kubectl apply deploy/kubernetes/ on the AKS cluster")
    for problem in kubectl_permissions.verify():
        fail(problem)
    done(started)


def check_templates(library: bicep_types.TypeLibrary) -> None:
    for deployment in DEPLOYMENTS:
        started = step(f"type checks: bicep/{deployment} and what it reaches, against Azure's type library, module wiring")
        report = Report(ROOT)
        bicep_wiring.check_deployment(BICEP / deployment, library, report)
        for finding in report.findings:
            fail(str(finding))
        done(started, f"tally: {report.tally}; {len(report.findings)} findings")


# Whether a VM size has a local temp disk (Azure's size pages: Dv4/Dsv4 and
# Dv5/Dsv5/Dasv5 have none; Dav4/Dasv4 and every "d" size such as Ddsv5 have
# one). Instance mix needs the same local-disk configuration across its sizes.
LOCAL_TEMP_DISK = {
    "Standard_D2s_v4": False,
    "Standard_D2_v4": False,
    "Standard_D2s_v5": False,
    "Standard_D2as_v5": False,
    "Standard_D2as_v4": True,
    "Standard_D2ds_v4": True,
    "Standard_D2ds_v5": True,
    "Standard_D2ads_v5": True,
    "Standard_D2s_v3": True,
}


def check_instance_mix() -> None:
    started = step("instance mix: every vmSizes list has one local-disk configuration")
    main = bicep_model.load(BICEP / "main.bicep")
    _, given = bicep_model.load_bicepparam(BICEP / "main.bicepparam")
    lists = {"main.bicep default": main.params["vmSizes"].default, "main.bicepparam": given.get("vmSizes")}
    for where, sizes in lists.items():
        if sizes is None:
            continue
        unknown = [size for size in sizes if size not in LOCAL_TEMP_DISK]
        if unknown:
            fail(f"{where}: vmSizes {unknown}: add each to LOCAL_TEMP_DISK with whether it has a temp disk")
        disks = {LOCAL_TEMP_DISK[size] for size in sizes if size in LOCAL_TEMP_DISK}
        if len(disks) > 1:
            fail(f"{where}: vmSizes {sizes} mix sizes with and without a local temp disk")
    done(started, "; ".join(f"{where}: {sizes}" for where, sizes in lists.items()))


def check_autoscale() -> None:
    started = step("autoscale: rules rendered from modules/autoscale.bicep, evaluated on the scale-in table")
    rows, problems = autoscale_model.run_table(BICEP)
    for line in autoscale_model.format_table(rows):
        print(f"    {line}")
    for problem in problems:
        fail(f"autoscale: {problem}")
    # Negative controls: the old scale-in rule ("< 1" without protection),
    # the prompt rule without the workers' protection, and the prompt rule
    # straight to the minimum (no step) must each fail the table.
    profile, values = autoscale_model.render(BICEP, {"scaleInProtection": False})
    per_instance = int(values["backlogPerInstance"])
    _, old_problems = autoscale_model.evaluate_table(autoscale_model.old_scale_in(profile), per_instance)
    if not old_problems:
        fail("autoscale: the table no longer catches the old scale-in rule ('< 1'): it proves nothing")
    prompt, _ = autoscale_model.render(BICEP, {"scaleInProtection": True})
    _, unprotected_problems = autoscale_model.evaluate_table(prompt, per_instance, protection=False)
    if not unprotected_problems:
        fail("autoscale: the table no longer catches the prompt rule deployed without the workers' protection")
    straight = dataclasses.replace(prompt, rules=tuple(
        dataclasses.replace(rule, action_type="ExactCount", value=prompt.minimum)
        if rule.direction == "Decrease" else rule for rule in prompt.rules))
    _, straight_problems = autoscale_model.evaluate_table(straight, per_instance, protection=True)
    if not any("more than a step" in problem for problem in straight_problems):
        fail("autoscale: the table no longer catches a prompt scale-in straight to the minimum (no step)")
    done(started, f"{len(rows)} cases (with and without the workers' protection), each under the "
                  f"{len(autoscale_model.READINGS)} readings of the per-instance queue metric; the old rule ('< 1') "
                  f"fails it in {len(old_problems)} places, the prompt rule without protection in "
                  f"{len(unprotected_problems)}, straight to the minimum in {len(straight_problems)}")
    started = step("autoscale: the regular lane's rules (modules/regular-autoscale.bicep), from zero, on their table")
    rows, problems = regular_autoscale.run_table(BICEP)
    for line in regular_autoscale.format_table(rows):
        print(f"    {line}")
    for problem in problems:
        fail(f"regular autoscale: {problem}")
    # Negative control: without the scale-in rule on the Spot VMs, the
    # keeper's VM would flap while Spot is away.
    profile = regular_autoscale.render(BICEP)
    flapping = [
        case for case in regular_autoscale.cases(profile, 0)
        if "keeper's VM while Spot stays away" in case.name
        and any(regular_autoscale.decide(regular_autoscale.without_spot_guard(profile), case, *combo) == 0
                for combo in regular_autoscale.readings(case))
    ]
    if not flapping:
        fail("regular autoscale: the table no longer catches a keeper VM scaled in while Spot is away: it proves nothing")
    done(started, f"{len(rows)} cases, each under every combination of the readings of the per-instance queue metric, "
                  "of it at zero instances, and of a Spot scale set without VMs; without the Spot guard on scale-in "
                  "the keeper's VM flaps")


# The job queue's message time-to-live in days: the service default (7 days),
# which every sender here uses (crates/azure MessageTtl::ServiceDefault).
QUEUE_MESSAGE_TTL_DAYS = 7
# How old a checkpoint's chunks may be when its job's message is sent
# (crates/storage/src/checkpoint/freshness.rs, REFRESH_AFTER): the rule must
# spare them for the message's whole life after that.
CHUNK_REFRESH_DAYS = 3
RETENTION_FLOOR_DAYS = QUEUE_MESSAGE_TTL_DAYS + CHUNK_REFRESH_DAYS


def check_checkpoint_retention() -> None:
    started = step("checkpoint retention: a lifecycle rule on the checkpoint container, never shorter than the message TTL plus the chunks' refresh age")
    storage = bicep_model.load(BICEP / "modules" / "storage.bicep")
    name = "checkpointRetentionDays"
    templates = [("modules/storage.bicep", storage, None)]
    for deployment in DEPLOYMENTS:
        template = deployment.replace(".bicepparam", ".bicep")
        _, given = bicep_model.load_bicepparam(BICEP / deployment)
        templates.append((template, bicep_model.load(BICEP / template), (deployment, given)))
    for where, template, params in templates:
        param = template.params.get(name)
        if param is None:
            fail(f"{where}: no parameter {name}")
            continue
        floor = param.decorators.get("minValue")
        if not isinstance(floor, int) or floor < RETENTION_FLOOR_DAYS:
            fail(f"{where}: {name} needs @minValue({RETENTION_FLOOR_DAYS}) or more (the message TTL plus the chunks' refresh age), has {floor!r}")
        if param.has_default and int(param.default) < RETENTION_FLOOR_DAYS:
            fail(f"{where}: {name} defaults to {param.default}, below the message TTL")
        if params is None:
            continue
        deployment, given = params
        value = given.get(name)
        if value is not None and int(value) < RETENTION_FLOOR_DAYS:
            fail(f"{deployment}: {name} = {value}, below the message TTL")
        if template.modules.get("storage") and template.modules["storage"].params.get(name) != name:
            fail(f"{where}: the storage module is not given {name}")
    rules = [
        rule
        for resource in storage.resources.values()
        if resource.type == "Microsoft.Storage/storageAccounts/managementPolicies"
        for rule in resource.body.get("properties", {}).get("policy", {}).get("rules", [])
    ]
    matching = [
        rule
        for rule in rules
        if rule.get("enabled", True)
        and "${checkpoints.name}/" in rule.get("definition", {}).get("filters", {}).get("prefixMatch", [])
        and rule.get("definition", {}).get("actions", {}).get("baseBlob", {}).get("delete", {})
        .get("daysAfterModificationGreaterThan") == name
    ]
    if not matching:
        fail("modules/storage.bicep: no enabled lifecycle rule deletes the checkpoint container's blobs "
             f"daysAfterModificationGreaterThan: {name}")
    done(started, f"{len(matching)} rule(s); floor {RETENTION_FLOOR_DAYS} days; {len(DEPLOYMENTS)} deployments pass it on")


def render_cloud_init(params: dict[str, str], variant: str) -> dict[str, str]:
    """Evaluates compute.bicep's template variables; returns them by name."""
    started = step(f"render cloud-init as modules/compute.bicep does ({variant})")
    values: dict[str, str] = {}
    for name, expr in re.findall(r"^var (\w+) = (.+)$", COMPUTE.read_text(), flags=re.M):
        values[name] = evaluate(expr.strip(), values, params)
    for name in ("workerEnv", "workerUnit", "installScript", "cloudInit"):
        if name not in values:
            fail(f"compute.bicep defines no var {name}")
            continue
        left = sorted(set(re.findall(r"\{\{\w+\}\}", values[name])))
        if left:
            fail(f"{name} still has unfilled placeholders after rendering: {left}")
    done(started, f"{len(values.get('cloudInit', ''))} bytes of customData (limit 65535 after base64 decoding)")
    if len(values.get("cloudInit", "")) > 65535:
        fail("cloud-init document exceeds customData's 64 KiB")
    return values


def evaluate(expr: str, values: dict[str, str], params: dict[str, str]) -> str:
    if m := re.fullmatch(r"loadTextContent\('([^']+)'\)", expr):
        return (COMPUTE.parent / m.group(1)).read_text()
    if m := re.fullmatch(r"base64\((\w+)\)", expr):
        return base64.b64encode(evaluate(m.group(1), values, params).encode()).decode()
    if m := re.fullmatch(r"replace\((\w+), '([^']*)', (.+)\)", expr):
        return evaluate(m.group(1), values, params).replace(
            m.group(2), evaluate(m.group(3), values, params)
        )
    if m := re.fullmatch(r"'([^']*)'", expr):
        return m.group(1)
    if expr in values:
        return values[expr]
    if expr in params:
        return params[expr]
    raise SystemExit(f"check_infra.py cannot evaluate compute.bicep expression {expr!r}: extend evaluate()")


def validate_cloud_init(document: str, workdir: pathlib.Path) -> dict[str, str]:
    started = step("cloud-init schema --config-file (rendered document)")
    path = workdir / "cloud-init.yaml"
    path.write_text(document)
    result = subprocess.run(
        ["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True
    )
    if result.returncode != 0:
        fail(f"cloud-init schema rejected the document:\n{result.stdout}{result.stderr}")
    config = yaml.safe_load(document)
    files = {}
    for entry in config.get("write_files", []):
        if entry.get("encoding") != "b64":
            fail(f"write_files {entry.get('path')} is not base64-encoded")
            continue
        files[entry["path"]] = base64.b64decode(entry["content"]).decode()
    for needed in (
        "/etc/spot-worker/worker.env",
        "/etc/systemd/system/spot-worker.service",
        "/usr/local/lib/spot-worker/install-worker.sh",
    ):
        if needed not in files:
            fail(f"cloud-init does not write {needed}")
    done(started, (result.stdout.strip() or "valid"))
    return files


def verify_unit(
    files: dict[str, str], worker_binary: pathlib.Path, workdir: pathlib.Path, exec_start_wanted: str
) -> None:
    started = step("systemd-analyze verify (the unit cloud-init writes)")
    unit = files.get("/etc/systemd/system/spot-worker.service", "")
    env_path = workdir / "worker.env"
    env_path.write_text(files.get("/etc/spot-worker/worker.env", ""))
    if not worker_binary.is_file():
        fail(f"--worker-binary {worker_binary} does not exist (cargo build --example primes first)")
        return
    exec_start = re.search(r"^ExecStart=(\S+)", unit, flags=re.M)
    if not exec_start:
        fail("the unit has no ExecStart")
        return
    whole = re.search(r"^ExecStart=(.*)$", unit, flags=re.M).group(1).strip()
    if whole != exec_start_wanted:
        fail(f"the unit's ExecStart is {whole!r}, not {exec_start_wanted!r}")
    rendered = unit.replace(exec_start.group(1), str(worker_binary))
    rendered = rendered.replace("EnvironmentFile=/etc/spot-worker/worker.env", f"EnvironmentFile={env_path}")
    unit_path = workdir / "spot-worker.service"
    unit_path.write_text(rendered)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit_path)], capture_output=True, text=True
    )
    # Warnings about the host's own units (not ours) are not our concern.
    ours = [line for line in (result.stdout + result.stderr).splitlines() if "spot-worker" in line]
    if result.returncode != 0 or ours:
        fail("systemd-analyze verify:\n" + (result.stdout + result.stderr))
    for directive, wanted in (
        ("Restart", "always"),
        ("KillSignal", "SIGTERM"),
        ("TimeoutStopSec", "28s"),
    ):
        if not re.search(rf"^{directive}={wanted}$", unit, flags=re.M):
            fail(f"the unit does not say {directive}={wanted}")
    done(started)


def check_workbook() -> None:
    started = step("workbook.json: valid, and queries only metrics the telemetry crate defines")
    text = (BICEP / "workbook.json").read_text()
    workbook = json.loads(text)
    sources = sorted(TELEMETRY_SRC.rglob("*.rs"))
    metrics_rs = "\n".join(p.read_text() for p in sources)
    known = set(re.findall(r'"(spot_worker\.[a-z_.]+)"', metrics_rs))
    used = set(re.findall(r"'(spot_worker\.[a-z_.]+)'", text))
    for name in sorted(used - known):
        fail(f"workbook queries {name}, which crates/telemetry does not define")
    # The panels docs/deploying.md lists ("Telemetry"), in its order: each
    # title starts with one, and there is no other panel.
    listed = ("Throughput", "Failures", "Evictions, releases and waits", "Poisoned messages",
              "Eviction notices", "Notice to drained", "Workers ready", "Where finished jobs' time went",
              "Goodput", "The fleet's bill", "Queue depth")
    panels = [i["content"].get("title", "") for i in workbook["items"] if i.get("type") != 1]
    for panel in listed:
        if not any(title.lower().startswith(panel.lower()) for title in panels):
            fail(f"workbook has no {panel} panel (docs/deploying.md lists it)")
    for title in panels:
        if not any(title.lower().startswith(panel.lower()) for panel in listed):
            fail(f"workbook panel {title!r} is not among those docs/deploying.md lists: "
                 "add it there and to `listed` in tools/infra/check_infra.py")
    # QueueMessageCount is a capacity metric Azure emits hourly: a panel that
    # does not say so reads as the live queue.
    depth = [i["content"].get("title", "") for i in workbook["items"] if "queue depth" in
             i["content"].get("title", "").lower()]
    if not all("hourly" in title.lower() for title in depth):
        fail(f"the queue-depth panel title must say its metric is refreshed hourly: {depth}")
    done(started, f"{len(panels)} panels, {len(used)} metric names")


def check_skips() -> None:
    started = step("every checkov skip in bicep/ gives its reason")
    count = 0
    for path in sorted(BICEP.rglob("*.bicep")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if "checkov:skip" not in line:
                continue
            count += 1
            m = re.search(r"checkov:skip=(CKV2?_[A-Z]+_\d+):(.*)$", line)
            if not m or len(m.group(2).strip()) < 40:
                fail(f"{path.relative_to(ROOT)}:{number}: a checkov skip needs an id and a reason")
    done(started, f"{count} skips")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker-binary", type=pathlib.Path, required=True)
    args = parser.parse_args()
    parse_bicep()
    library = bicep_types.TypeLibrary(TYPES)
    check_templates_self_test(library)
    check_templates(library)
    check_liveness_route()
    check_permissions()
    check_instance_mix()
    check_autoscale()
    check_checkpoint_retention()
    for variant, params, exec_start in (
        ("the worker binary", SAMPLE_PARAMS, "/opt/spot-worker/bin/worker"),
        ("the command path with a bundle", COMMAND_PARAMS, COMMAND_EXEC_START),
        ("the regular lane's scale set", REGULAR_PARAMS, "/opt/spot-worker/bin/worker"),
    ):
        values = render_cloud_init(params, variant)
        with tempfile.TemporaryDirectory(prefix="spot-worker-infra-") as tmp:
            workdir = pathlib.Path(tmp)
            files = validate_cloud_init(values["cloudInit"], workdir)
            verify_unit(files, args.worker_binary.resolve(), workdir, exec_start)
            script = workdir / "install-worker.sh"
            script.write_text(files.get("/usr/local/lib/spot-worker/install-worker.sh", ""))
            started = step("shellcheck (the rendered install script)")
            result = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
            if result.returncode != 0:
                fail(f"shellcheck on the rendered install script:\n{result.stdout}")
            done(started)
    check_workbook()
    check_skips()
    if failures:
        print(f"{len(failures)} infra check(s) failed", file=sys.stderr)
        return 1
    print("infra checks: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
