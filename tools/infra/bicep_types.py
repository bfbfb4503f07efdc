"""Walks resource bodies against Azure's type library (the Bicep compiler's own).

`TypeLibrary` indexes tools/infra/azure-types/bicep-types/**/types.json by
"<resource type>@<api version>". `BodyChecker` walks one resource body against
its type: unknown or misplaced properties, read-only ones, missing required
ones, wrong JSON types, and literal values outside enums (flag enums such as
`networkAcls.bypass` take comma lists), integer and length bounds, patterns.

A value the checker cannot know offline (a parameter, a function call, an
interpolated string) is not value-checked, but an object's property names are
always checked. One exception makes parameters useful: a parameter with
@allowed values stands for each of them, so every allowed value must fit the
property it is used for (a parameter that allows what Azure refuses is a
mistake waiting for a user to pick it).
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import bicep_model
from findings import Report

# Bicep syntax inside a resource body that is not a property of the resource.
BICEP_KEYWORDS = {"parent", "scope", "dependsOn", "depends_on"}

FLAG_REQUIRED, FLAG_READ_ONLY = 1, 2

# Enum properties whose value is a comma-separated combination of the listed
# values (their descriptions say "any combination of").
FLAG_ENUM_HINT = re.compile(r"any combination of", re.I)

# Integer properties that Azure really takes as decimals (the type library has
# no float type, so it says IntegerType; the description says "decimal", e.g.
# a Spot max price of 0.05). An `int` parameter there cannot carry 0.05: the
# template must take a string and pass json(it).
DECIMAL_HINT = re.compile(r"\bdecimal value", re.I)


class TypeLibrary:
    def __init__(self, root: pathlib.Path) -> None:
        self.resources: dict[str, tuple[list[dict], int]] = {}
        for path in sorted(root.rglob("types.json")):
            types = json.loads(path.read_text())
            for index, entry in enumerate(types):
                if entry["$type"] == "ResourceType":
                    self.resources[entry["name"].lower()] = (types, index)

    def resource(self, type_name: str, api_version: str) -> tuple[list[dict], dict] | None:
        found = self.resources.get(f"{type_name}@{api_version}".lower())
        if found is None:
            return None
        types, index = found
        return types, types[index]


def deref(types: list[dict], ref: dict) -> dict:
    return types[int(ref["$ref"].rsplit("/", 1)[1])]


class BodyChecker:
    """Checks the resources of one template against the library."""

    def __init__(self, library: TypeLibrary, template: bicep_model.Template, report: Report) -> None:
        self.library = library
        self.template = template
        self.report = report
        self.symbols = template.symbols

    def check_all(self) -> None:
        for resource in self.template.resources.values():
            self.check_resource(resource)

    def check_resource(self, resource: bicep_model.Resource) -> None:
        found = self.library.resource(resource.type, resource.api_version)
        self.resource = resource
        if found is None:
            self.add(
                "unknown-type",
                resource.symbol,
                f"{resource.type}@{resource.api_version} is not in the vendored type library "
                "(tools/infra/azure-types): a typo, or an API version to vendor",
            )
            return
        self.report.tally.resources += 1
        if resource.existing:
            return  # only a name; its body belongs to the resource's own template
        self.types, resource_type = found
        body = {k: v for k, v in resource.body.items() if k not in BICEP_KEYWORDS}
        self.check_value(body, resource_type["body"], resource.symbol)

    # -- values -----------------------------------------------------------

    def check_value(self, value: Any, ref: dict, where: str, description: str = "") -> None:
        expected = deref(self.types, ref)
        kind = expected["$type"]
        if bicep_model.is_loop(value):
            if kind == "ArrayType":
                self.check_value(value["config"], expected["itemType"], f"{where}[]")
            else:
                self.add("wrong-type", where, f"a for-expression (array) where {describe(expected)} belongs")
            return
        branches = conditional_branches(value)
        if branches is not None:
            # cond ? a : b - the condition is unknown offline, both branches
            # are checked (null leaves the property out).
            for branch in branches:
                if branch is not None:
                    self.check_value(branch, ref, where, description)
            return
        literal, param = self.literal(value)
        if (literal is UNKNOWN and param is not None and param.type == "int" and kind == "IntegerType"
                and DECIMAL_HINT.search(description)):
            self.add("decimal-as-int", where,
                     f"int param {param.name} where Azure takes a decimal (e.g. 0.05): bicep has no float type, "
                     "so take a string parameter and pass json(it)")
        if literal is UNKNOWN:
            if param is not None and "allowed" in param.decorators:
                for allowed in param.decorators["allowed"] or []:
                    self.check_value(allowed, ref, f"{where} (value {allowed!r} @allowed by param {param.name})",
                                     description)
            return
        value = literal
        if kind == "ObjectType":
            self.check_object(value, expected, where)
        elif kind == "DiscriminatedObjectType":
            self.check_discriminated(value, expected, where)
        elif kind == "ArrayType":
            self.check_array(value, expected, where)
        elif kind == "UnionType":
            self.check_union(value, expected, where, description)
        else:
            self.check_scalar(value, expected, where)

    def literal(self, value: Any) -> tuple[Any, bicep_model.Param | None]:
        """(the literal value, None) or (UNKNOWN, the parameter it reads, if any)."""
        if bicep_model.is_call(value) or bicep_model.is_interpolated(value):
            return UNKNOWN, None
        if isinstance(value, str) and value in self.symbols:
            if value in self.template.params:
                return UNKNOWN, self.template.params[value]
            if value in self.template.variables:
                inner = self.template.variables[value]
                if isinstance(inner, (str, int, bool)) and not (isinstance(inner, str) and (
                        inner in self.symbols or bicep_model.is_interpolated(inner))):
                    return inner, None
            return UNKNOWN, None
        return value, None

    def check_object(self, value: Any, expected: dict, where: str) -> None:
        if not isinstance(value, dict):
            self.add("wrong-type", where, f"{short(value)} where {describe(expected)} belongs")
            return
        properties = expected.get("properties", {})
        for key, item in value.items():
            self.report.tally.properties += 1
            path = f"{where}.{key}"
            spec = properties.get(key)
            if spec is None:
                computed_key = key.startswith("'") or "${" in key
                extra = expected.get("additionalProperties")
                if extra is not None:
                    self.check_value(item, extra, path)
                elif not computed_key:
                    self.unknown_property(key, expected, path)
                continue
            if spec.get("flags", 0) & FLAG_READ_ONLY:
                self.add("read-only", path, f"{key} is read-only: Azure sets it ({spec.get('description', '')[:80]})")
                continue
            self.check_value(item, spec["type"], path, spec.get("description", ""))
        for key, spec in properties.items():
            if spec.get("flags", 0) & FLAG_REQUIRED and key not in value:
                self.add("required-missing", where, f"required property {key} is missing ({expected.get('name')})")

    def check_discriminated(self, value: Any, expected: dict, where: str) -> None:
        if not isinstance(value, dict):
            self.add("wrong-type", where, f"{short(value)} where {describe(expected)} belongs")
            return
        discriminator = expected["discriminator"]
        chosen = value.get(discriminator)
        literal, _ = self.literal(chosen)
        element = expected["elements"].get(literal) if isinstance(literal, str) else None
        merged = {"$type": "ObjectType", "name": expected.get("name"), "properties": dict(expected["baseProperties"])}
        if element is not None:
            merged["properties"].update(deref(self.types, element).get("properties", {}))
        elif literal is not UNKNOWN:
            self.add("bad-value", f"{where}.{discriminator}",
                     f"{literal!r} is not one of {sorted(expected['elements'])}")
            return
        else:
            return  # the variant is not known offline
        self.check_object(value, merged, where)

    def check_array(self, value: Any, expected: dict, where: str) -> None:
        if not isinstance(value, list):
            self.add("wrong-type", where, f"{short(value)} where {describe(expected)} belongs")
            return
        self.check_bounds(len(value), expected, where, "items", "minLength", "maxLength")
        for index, item in enumerate(value):
            self.check_value(item, expected["itemType"], f"{where}[{index}]")

    def check_union(self, value: Any, expected: dict, where: str, description: str) -> None:
        members = [deref(self.types, ref) for ref in expected["elements"]]
        literals = [m["value"] for m in members if m["$type"] == "StringLiteralType"]
        others = [ref for ref, m in zip(expected["elements"], members) if m["$type"] not in ("StringLiteralType",
                                                                                            "StringType")]
        if isinstance(value, str) and literals:
            self.report.tally.values += 1
            parts = [p.strip() for p in value.split(",")] if FLAG_ENUM_HINT.search(description) else [value]
            wrong = [p for p in parts if p not in literals]
            if wrong:
                combo = " (a comma-separated combination)" if len(parts) > 1 or FLAG_ENUM_HINT.search(
                    description) else ""
                self.add("bad-value", where, f"{', '.join(map(repr, wrong))} is not one of {literals}{combo}")
            return
        if not others:
            if not isinstance(value, str):
                self.add("wrong-type", where, f"{short(value)} where a string ({literals}) belongs")
            return
        # An object/array union: the value must fit one member.
        best: list | None = None
        for ref in others:
            trial = Report(self.report.root)
            probe = BodyChecker(self.library, self.template, trial)
            probe.types, probe.resource = self.types, self.resource
            probe.check_value(value, ref, where)
            if not trial.findings:
                return
            if best is None or len(trial.findings) < len(best):
                best = trial.findings
        self.report.findings.extend(best or [])

    def check_scalar(self, value: Any, expected: dict, where: str) -> None:
        kind = expected["$type"]
        self.report.tally.values += 1
        if kind == "AnyType":
            return
        if kind == "StringLiteralType":
            if value != expected["value"]:
                self.add("bad-value", where, f"{short(value)} is not {expected['value']!r}")
        elif kind == "StringType":
            if not isinstance(value, str):
                self.add("wrong-type", where, f"{short(value)} where a string belongs")
                return
            self.check_bounds(len(value), expected, where, "characters", "minLength", "maxLength")
            if "pattern" in expected and not re.search(expected["pattern"], value):
                self.add("bad-value", where, f"{value!r} does not match {expected['pattern']}")
        elif kind == "IntegerType":
            if isinstance(value, bool) or not isinstance(value, int):
                self.add("wrong-type", where, f"{short(value)} where an integer belongs")
                return
            self.check_bounds(value, expected, where, "", "minValue", "maxValue")
        elif kind == "BooleanType":
            if not isinstance(value, bool):
                self.add("wrong-type", where, f"{short(value)} where a bool belongs")

    def check_bounds(self, amount: int, expected: dict, where: str, unit: str, low: str, high: str) -> None:
        if low in expected and amount < expected[low]:
            self.add("bad-value", where, f"{amount} {unit} is below the minimum {expected[low]}".replace("  ", " "))
        if high in expected and amount > expected[high]:
            self.add("bad-value", where, f"{amount} {unit} is above the maximum {expected[high]}".replace("  ", " "))

    def unknown_property(self, key: str, expected: dict, path: str) -> None:
        elsewhere = self.where_defined(key)
        if elsewhere:
            self.add("misplaced-property", path,
                     f"{key} is not a property of {expected.get('name')}; it belongs at {', '.join(elsewhere)}")
        else:
            known = sorted(expected.get("properties", {}))
            self.add("unknown-property", path, f"{key} is not a property of {expected.get('name')} (known: {known})")

    def where_defined(self, key: str) -> list[str]:
        """Where in this resource's body `key` is a settable property, as
        paths from the body (breadth first: the shortest path to each type)."""
        found: list[str] = []
        seen: set[str] = set()
        _, resource_type = self.library.resource(self.resource.type, self.resource.api_version)
        pending = [(resource_type["body"], self.resource.symbol)]
        while pending and len(seen) < 2000:
            ref, path = pending.pop(0)
            if ref["$ref"] in seen:
                continue
            seen.add(ref["$ref"])
            node = deref(self.types, ref)
            props = dict(node.get("properties", {}))
            props.update(node.get("baseProperties", {}))
            if key in props and not props[key].get("flags", 0) & FLAG_READ_ONLY:
                found.append(f"{path}.{key}")
            pending += [(spec["type"], f"{path}.{name}") for name, spec in props.items()]
            pending += [(node[k], f"{path}[]") for k in ("itemType", "additionalProperties") if node.get(k)]
            elements = node.get("elements", [])
            pending += [(r, path) for r in (elements.values() if isinstance(elements, dict) else elements)]
        return found

    def add(self, kind: str, where: str, message: str) -> None:
        self.report.add(kind, self.template.path, self.resource.line, where, message)


def conditional_branches(value: Any) -> tuple[Any, Any] | None:
    if bicep_model.is_call(value) and value.get("operator", {}).get("type") == "conditional":
        operands = value["operator"]["operands"]
        return operands.get("true_value"), operands.get("false_value")
    return None


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


def describe(expected: dict) -> str:
    kind = expected["$type"]
    return {"ObjectType": "an object", "DiscriminatedObjectType": "an object", "ArrayType": "an array"}.get(
        kind, kind)


def short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
