"""Checks what the type library cannot: how templates fit together.

- module wiring: every parameter passed to a module is declared by it, every
  required one (no default) is passed, every `<module>.outputs.<name>` read
  exists, and literal values passed satisfy the module's decorators;
- parameter values against their decorators (@allowed, @minValue/@maxValue,
  @minLength/@maxLength) and declared type: a .bicepparam file's values, and
  every parameter's own default;
- a .bicepparam sets only declared parameters and every required one;
- every scale set's Application Health extension probes the worker's
  liveness path (health_probe).

`check_deployment` runs these and the resource-body walk (bicep_types) over an
entry template and every module it reaches.
"""

from __future__ import annotations

import pathlib
from typing import Any

import bicep_model
import bicep_types
import health_probe
from findings import Report

BICEP_TYPES = {"string": str, "int": int, "bool": bool, "array": list, "object": dict}


def decorator_violations(value: Any, param: bicep_model.Param) -> list[str]:
    """What is wrong with `value` for `param` (empty: nothing)."""
    wanted = BICEP_TYPES.get(param.type)
    if wanted is not None and (not isinstance(value, wanted) or (wanted is int and isinstance(value, bool))):
        return [f"{short(value)} is not of the declared type {param.type}"]
    problems = []
    decorators = param.decorators
    allowed = decorators.get("allowed")
    if allowed is not None:
        # On an array parameter, @allowed constrains every item.
        items = value if isinstance(value, list) and param.type == "array" else [value]
        outside = [item for item in items if item not in allowed]
        if outside:
            problems.append(f"{', '.join(map(short, outside))} not in @allowed({allowed})")
    if isinstance(value, int) and not isinstance(value, bool):
        if "minValue" in decorators and value < decorators["minValue"]:
            problems.append(f"{value} is below @minValue({decorators['minValue']})")
        if "maxValue" in decorators and value > decorators["maxValue"]:
            problems.append(f"{value} is above @maxValue({decorators['maxValue']})")
    if isinstance(value, (str, list)):
        if "minLength" in decorators and len(value) < decorators["minLength"]:
            problems.append(f"length {len(value)} is below @minLength({decorators['minLength']})")
        if "maxLength" in decorators and len(value) > decorators["maxLength"]:
            problems.append(f"length {len(value)} is above @maxLength({decorators['maxLength']})")
    return problems


def is_literal(value: Any, template: bicep_model.Template | None) -> bool:
    """True when the value is fully known offline (no reference or call inside)."""
    if bicep_model.is_call(value) or bicep_model.is_interpolated(value) or bicep_model.is_loop(value):
        return False
    if isinstance(value, str):
        return template is None or value not in template.symbols
    if isinstance(value, list):
        return all(is_literal(item, template) for item in value)
    if isinstance(value, dict):
        return all(is_literal(item, template) for item in value.values())
    return True


def check_param_defaults(template: bicep_model.Template, report: Report) -> None:
    for param in template.params.values():
        if param.has_default and is_literal(param.default, template):
            report.tally.params += 1
            for problem in decorator_violations(param.default, param):
                report.add("param-value", template.path, param.line, f"param {param.name} default", problem)


def check_module_call(caller: bicep_model.Template, module: bicep_model.Module, callee: bicep_model.Template,
                      report: Report) -> None:
    report.tally.modules += 1
    where = f"module {module.symbol} ({module.path.name})"
    for name, value in module.params.items():
        param = callee.params.get(name)
        if param is None:
            report.add("module-param-unknown", caller.path, module.line, where,
                       f"passes {name}, which {module.path.name} does not declare")
            continue
        for candidate in possible_values(value, caller):
            report.tally.params += 1
            for problem in decorator_violations(candidate, param):
                report.add("param-value", caller.path, module.line, f"{where} param {name}", problem)
    for name, param in callee.params.items():
        if not param.has_default and name not in module.params:
            report.add("module-param-missing", caller.path, module.line, where,
                       f"does not pass {name}, which {module.path.name} requires (no default)")


def possible_values(value: Any, template: bicep_model.Template) -> list[Any]:
    """The values an argument can take, when known offline: a literal, or the
    @allowed values of a parameter passed straight through."""
    if is_literal(value, template):
        return [value]
    if isinstance(value, str) and value in template.params:
        return list(template.params[value].decorators.get("allowed") or [])
    return []


def check_output_references(template: bicep_model.Template, callees: dict[str, bicep_model.Template],
                            report: Report) -> None:
    places = [("var " + n, v) for n, v in template.variables.items()]
    places += [("output " + n, v) for n, v in template.outputs.items()]
    places += [(f"module {m.symbol}", m.params) for m in template.modules.values()]
    places += [(f"resource {r.symbol}", r.body) for r in template.resources.values()]
    for where, value in places:
        for symbol, name in bicep_model.module_output_references(value):
            callee = callees.get(symbol)
            if callee is not None and name not in callee.outputs:
                line = template.modules[symbol].line
                report.add("module-output-unknown", template.path, line, where,
                           f"reads {symbol}.outputs.{name}; {callee.path.name} declares {sorted(callee.outputs)}")


def check_bicepparam(path: pathlib.Path, report: Report) -> bicep_model.Template:
    using, values = bicep_model.load_bicepparam(path)
    target = (path.parent / (using or "")).resolve()
    template = bicep_model.load(target)
    for name, value in values.items():
        param = template.params.get(name)
        if param is None:
            report.add("param-unknown", path, 0, f"param {name}", f"{target.name} declares no parameter {name}")
            continue
        report.tally.params += 1
        for problem in decorator_violations(value, param):
            report.add("param-value", path, 0, f"param {name}", problem)
    for name, param in template.params.items():
        if not param.has_default and name not in values:
            report.add("param-missing", path, 0, f"param {name}", f"required by {target.name} (no default), not set")
    return template


def check_deployment(bicepparam: pathlib.Path, library: bicep_types.TypeLibrary, report: Report) -> None:
    """Everything above, for the template a .bicepparam uses and its modules."""
    entry = check_bicepparam(bicepparam, report)
    pending, seen = [entry], {entry.path}
    while pending:
        template = pending.pop()
        bicep_types.BodyChecker(library, template, report).check_all()
        check_param_defaults(template, report)
        health_probe.check(template, report)
        callees = {}
        for module in template.modules.values():
            callee = bicep_model.load(module.path)
            callees[module.symbol] = callee
            check_module_call(template, module, callee, report)
            if callee.path not in seen:
                seen.add(callee.path)
                pending.append(callee)
        check_output_references(template, callees, report)


def short(value: Any) -> str:
    return bicep_types.short(value)
