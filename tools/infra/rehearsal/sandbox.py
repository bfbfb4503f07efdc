"""The rehearsal's sandbox: a copy of the repository's deploy files, a bin
directory whose `az`, `kubectl`, `kubelogin`, `sleep` and `curl` are stand-ins,
and the model of the subscription and cluster they answer from
(`fresh_world`: nothing deployed yet)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
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
                "vmssName": "spotworker-vmss", "regularVmssName": "spotworker-regular-vmss",
                "regularQueueName": "jobs-regular", "appInsightsName": "spotworker-ai", "natPublicIp": "198.51.100.9"},
            "aks": {
                "clusterName": "spotworker-aks", "storageAccountName": ACCOUNT,
                "blobEndpoint": f"https://{ACCOUNT}.blob.core.windows.net/",
                "queueEndpoint": f"https://{ACCOUNT}.queue.core.windows.net/", "queueName": "jobs",
                "resultsContainer": "results", "workerClientId": "00000000-0000-0000-0000-000000000001",
                "scalerClientId": SCALER, "tenantId": "00000000-0000-0000-0000-000000000003",
                "appInsightsName": "spotworker-ai", "regularQueueName": "jobs-regular"},
        },
        "scale_set": {"name": "spotworker-vmss", "exists": False, "capacity": 0},
        # The regular lane's (docs/deploying.md, "The two lanes"): regular VMs, from zero.
        "regular_set": {"name": "spotworker-regular-vmss", "exists": False, "capacity": 0},
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
