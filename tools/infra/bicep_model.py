"""A .bicep file as the type checks need it, read with pycep-parser.

pycep gives a dict per file; this module turns it into a `Template` (params
with their decorators, vars, resources, modules, outputs) and answers the one
question pycep leaves open: is a value a literal or an expression? pycep writes
a quoted string and a bare identifier the same way (`'jobs'` and `queueName`
both become "jobs"/"queueName"), so a string naming a symbol of the file (a
param, var, resource, module or loop variable) is taken as a reference. Such a
reference hides a literal only when a string literal happens to equal a symbol
name; then its value is not checked (never a false finding).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re
from typing import Any

from pycep import BicepParser

# pycep's decorator names -> Bicep's.
DECORATORS = {
    "allowed": "allowed",
    "min_value": "minValue",
    "max_value": "maxValue",
    "min_length": "minLength",
    "max_length": "maxLength",
    "description": "description",
    "secure": "secure",
}


@dataclasses.dataclass
class Param:
    name: str
    type: str
    default: Any
    has_default: bool
    decorators: dict[str, Any]
    line: int


@dataclasses.dataclass
class Resource:
    symbol: str
    type: str
    api_version: str
    existing: bool
    body: dict[str, Any]
    line: int


@dataclasses.dataclass
class Module:
    symbol: str
    path: pathlib.Path
    params: dict[str, Any]
    line: int


@dataclasses.dataclass
class Template:
    path: pathlib.Path
    params: dict[str, Param]
    variables: dict[str, Any]
    resources: dict[str, Resource]
    modules: dict[str, Module]
    outputs: dict[str, Any]
    raw: dict[str, Any]

    @property
    def symbols(self) -> set[str]:
        names = set(self.params) | set(self.variables) | set(self.modules)
        # Nested resources are keyed parent__child by pycep; Bicep code refers
        # to them by their own name (parent::child).
        names |= {symbol.split("__")[-1] for symbol in self.resources}
        return names | loop_variables(self.raw)


@functools.cache
def parser(add_line_numbers: bool = True) -> BicepParser:
    """One parser per process: building the grammar is the slow part."""
    return BicepParser(add_line_numbers=add_line_numbers)


@functools.cache
def load(path: pathlib.Path) -> Template:
    """The template at `path`, parsed once per process (the checks only read it)."""
    raw = parser().parse(file_path=path)
    return from_pycep(path, raw)


def from_pycep(path: pathlib.Path, raw: dict[str, Any]) -> Template:
    params = {
        name: Param(
            name=name,
            type=spec.get("type", ""),
            default=negative_literal(spec.get("default")),
            has_default=spec.get("default") is not None,
            decorators={
                DECORATORS.get(d["type"], d["type"]): d.get("argument") for d in spec.get("decorators", [])
            },
            line=spec.get("__start_line__", 0),
        )
        for name, spec in raw.get("parameters", {}).items()
    }
    variables = {name: spec.get("value") for name, spec in raw.get("variables", {}).items()}
    resources = {
        symbol: Resource(
            symbol=symbol,
            type=spec["type"],
            api_version=spec.get("api_version", ""),
            existing=bool(spec.get("existing")),
            body=unwrap_condition(spec.get("config", {})),
            line=spec.get("__start_line__", 0),
        )
        for symbol, spec in raw.get("resources", {}).items()
    }
    modules = {
        symbol: Module(
            symbol=symbol,
            path=(path.parent / spec["detail"]["path"]).resolve(),
            params=unwrap_condition(spec.get("config", {})).get("params", {}),
            line=spec.get("__start_line__", 0),
        )
        for symbol, spec in raw.get("modules", {}).items()
        if spec.get("type") == "local"
    }
    outputs = {name: spec.get("value") for name, spec in raw.get("outputs", {}).items()}
    return Template(path, params, variables, resources, modules, outputs, raw)


def unwrap_condition(config: dict[str, Any]) -> dict[str, Any]:
    """`resource x '...' = if (c) { ... }` reads as {condition, config}."""
    if set(config) == {"condition", "config"}:
        return config["config"]
    return config


def is_loop(value: Any) -> bool:
    return isinstance(value, dict) and "loop_type" in value and "config" in value


def is_call(value: Any) -> bool:
    """A function call or an operator (property access, ternary, ...)."""
    return (
        isinstance(value, dict)
        and len(value) == 1
        and next(iter(value)) in ("function", "operator")
        and isinstance(next(iter(value.values())), dict)
    )


def is_interpolated(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def loop_variables(raw: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(raw, dict):
        if is_loop(raw):
            detail = raw["loop_type"].get("detail", {})
            found |= {v for k, v in detail.items() if k.endswith("_name") and k != "array_name"}
        for value in raw.values():
            found |= loop_variables(value)
    elif isinstance(raw, list):
        for value in raw:
            found |= loop_variables(value)
    return found


def module_output_references(value: Any) -> list[tuple[str, str]]:
    """Every `<module>.outputs.<name>` a value reads, as (module, name)."""
    found: list[tuple[str, str]] = []
    if isinstance(value, str):
        found += re.findall(r"\b(\w+)\.outputs\.(\w+)", value)
    elif isinstance(value, dict):
        operator = value.get("operator") if is_call(value) else None
        if operator and operator.get("type") == "property_accessor":
            operands = operator["operands"]
            inner = operands.get("operand_2")
            if isinstance(operands.get("operand_1"), str) and is_call(inner):
                accessor = inner["operator"]
                if accessor.get("type") == "property_accessor" and accessor["operands"].get("operand_1") == "outputs":
                    name = accessor["operands"].get("operand_2")
                    if isinstance(name, str):
                        found.append((operands["operand_1"], name))
        for item in value.values():
            found += module_output_references(item)
    elif isinstance(value, list):
        for item in value:
            found += module_output_references(item)
    return found


def load_bicepparam(path: pathlib.Path) -> tuple[str | None, dict[str, Any]]:
    """Reads a .bicepparam file: (the `using` target, {param: value}).

    pycep has no .bicepparam grammar, but `param x = value` lines hold plain
    Bicep values: they are parsed as `var` declarations of a .bicep file, so
    the values are read by the same parser as the templates.
    """
    text = path.read_text()
    using = re.search(r"^using '([^']+)'\s*$", text, flags=re.M)
    body = re.sub(r"^using .*$", "", text, flags=re.M)
    body = re.sub(r"^param (\w+) =", r"var \1 =", body, flags=re.M)
    raw = parser(add_line_numbers=False).parse(text=body)
    values = {name: negative_literal(spec.get("value")) for name, spec in raw.get("variables", {}).items()}
    return (using.group(1) if using else None), values


def negative_literal(value: Any) -> Any:
    """`-1` as the integer it is: pycep reads it as the operator minus applied
    to the literal 1, which the checks would otherwise take for an expression
    of unknown type."""
    if is_call(value) and "operator" in value:
        operator = value["operator"]
        operands = operator.get("operands")
        if operator.get("type") == "minus" and isinstance(operands, dict) and "integer_value" in operands:
            return -int(operands["integer_value"])
    return value
