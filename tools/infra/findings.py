"""What the template checks report: one `Finding` per mistake, and a tally."""

from __future__ import annotations

import dataclasses
import pathlib

# Every kind a check can report; the planted-mistake fixture covers each one.
KINDS = (
    "unknown-type",  # resource type / API version not in the vendored type library
    "unknown-property",  # no such property anywhere in the resource's type
    "misplaced-property",  # the property exists, but at another place in the body
    "read-only",  # a property Azure sets itself
    "required-missing",  # a required property is not given
    "wrong-type",  # e.g. a string where an integer belongs
    "bad-value",  # outside the allowed set or bounds (enum, flag enum, min/max, pattern)
    "decimal-as-int",  # an int parameter where Azure takes a decimal (bicep has no float: string + json())
    "module-param-unknown",  # a module is passed a parameter it does not declare
    "module-param-missing",  # a module's required parameter is not passed
    "module-output-unknown",  # <module>.outputs.<name> that the module does not declare
    "param-unknown",  # a .bicepparam sets a parameter the template does not declare
    "param-missing",  # a .bicepparam leaves a required parameter unset
    "param-value",  # a parameter value breaks its decorators (@allowed, @minValue, ...)
    "health-probe",  # a scale set's health extension probes something other than /healthz
)


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    file: pathlib.Path
    line: int
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.where}: {self.message} [{self.kind}]"


@dataclasses.dataclass
class Tally:
    resources: int = 0
    properties: int = 0
    values: int = 0
    modules: int = 0
    params: int = 0

    def __str__(self) -> str:
        return (
            f"{self.resources} resources, {self.properties} properties, {self.values} literal values, "
            f"{self.modules} module calls, {self.params} parameter values checked"
        )


class Report:
    """Collects findings (and the tally) while the checks walk the templates."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.findings: list[Finding] = []
        self.tally = Tally()

    def add(self, kind: str, file: pathlib.Path, line: int, where: str, message: str) -> None:
        assert kind in KINDS, kind
        try:
            shown = file.resolve().relative_to(self.root)
        except ValueError:
            shown = file
        self.findings.append(Finding(kind, shown, line, where, message))
