"""The scale set's health probe must be the worker's liveness, never its
readiness.

Automatic repairs replace a VM whose Application Health extension reports
it unhealthy. `/readyz` is 503 for reasons every VM shares (storage refusing
or unreachable, Entra ID or IMDS down, the worker parked for a shared
event): probing it, repairs would replace VM after VM into the same outage
and Azure would then suspend them. So every Application Health extension of
a scale set must probe `/healthz` (crates/runtime/src/health.rs: 200 while
the process answers, whatever storage or IMDS do), given as a literal, so
that it is known offline.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any

import bicep_model
from findings import Report

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEALTH_RS = ROOT / "crates" / "runtime" / "src" / "health.rs"
LIVENESS_PATH = "/healthz"
HEALTH_EXTENSION_TYPES = ("ApplicationHealthLinux", "ApplicationHealthWindows")


def liveness_route_served() -> bool:
    """Whether the worker's health server still serves LIVENESS_PATH."""
    return re.search(r'\.route\(\s*"' + re.escape(LIVENESS_PATH) + '"', HEALTH_RS.read_text()) is not None


def check(template: bicep_model.Template, report: Report) -> None:
    """One finding per scale-set health extension not probing LIVENESS_PATH."""
    for resource in template.resources.values():
        if resource.type != "Microsoft.Compute/virtualMachineScaleSets" or resource.existing:
            continue
        profile = resource.body.get("properties", {}).get("virtualMachineProfile", {})
        extensions = profile.get("extensionProfile", {}).get("extensions", [])
        for extension in extensions if isinstance(extensions, list) else []:
            properties = extension.get("properties", {}) if isinstance(extension, dict) else {}
            if properties.get("type") not in HEALTH_EXTENSION_TYPES:
                continue
            path = _setting(properties, "requestPath")
            where = f"{resource.symbol} extension {extension.get('name', '?')}"
            if path != LIVENESS_PATH:
                report.add(
                    "health-probe", template.path, resource.line, where,
                    f"requestPath is {path!r}: the health extension (and automatic repairs) must probe "
                    f"the liveness path {LIVENESS_PATH!r}, never readiness",
                )


def _setting(properties: dict[str, Any], name: str) -> Any:
    settings = properties.get("settings", {})
    value = settings.get(name) if isinstance(settings, dict) else None
    return value
