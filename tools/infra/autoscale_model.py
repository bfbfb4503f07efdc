"""Autoscale as rendered from bicep/, evaluated the way Azure Monitor documents it.

Why: a Spot VM removed by an autoscale scale-in gets no Scheduled Event (Spot
has no terminate notification), so the worker on it cannot drain. The rules
must never remove an instance while any message is held. bicep/README.md
gives the documentation each step of this model follows:

- the queue metric (ApproximateMessageCount) counts every message not yet
  deleted: visible backlog *and* invisible, in-flight ones (it is "not lower
  than the actual number of messages", possibly higher);
- for the storage-queue metric Azure compares a per-instance value (total /
  instances) with the threshold, and `dividePerInstance` asks for the same
  division. The docs do not say what the two together do, so every rule is
  evaluated under three readings: "total" (only `dividePerInstance`
  divides), "per instance" (the metric is divided once, whatever
  `dividePerInstance` says) and "divided twice" (Azure divides the queue
  metric and `dividePerInstance: true` divides it again, by instances²).
  The safety property (no scale-in while a message is held) must hold under
  all three; the scale-out property under the first two. Under "divided
  twice" the table shows what the rule does instead: a backlog scales out
  only above backlogPerInstance x instances², so the fleet grows slower than
  intended (docs/deploying.md says how to read the observed value after a
  deploy and tell which reading Azure applies);
- scale-out happens if any scale-out rule fires; scale-in only if all
  scale-in rules fire; the result is clamped to [minimum, maximum];
- when the metric is missing, capacity becomes `default` only if the current
  count is lower (never a scale-in).

With scaleInProtection (main.bicep's default) the scale-in rule is the
prompt one: fewer messages than instances on average over the window ->
scaleInStep fewer instances. It may fire while jobs run, because every
worker holding a message keeps its own VM protected from scale-in
(protectFromScaleIn, SPOT_WORKER_SCALE_IN_PROTECTION=on from the same
parameter) and Azure removes only unprotected VMs. A case therefore also
says how many VMs are busy (protected) and how many are idle but still in
their idle grace (protected too); `removals` is Azure's choice under that
documented behaviour, and the table checks, for the prompt rule: no busy VM
removed, idle ones removed when the queue holds less work than the fleet,
never below the minimum, no scale-in while there is a message for every
instance, and never more than scaleInStep asked at once (what a scale-in
asking for more VMs than are unprotected does is not documented: the step
bounds the harm). `wiring_problems` checks that main.bicep drives the
worker's setting, the role and the prompt rule from the one parameter.

`render` reads the rules out of modules/autoscale.bicep with the parameter
values main.bicepparam gives (through main.bicep's module call), or with
`overrides` on top; `decide` is the pure decision; `run_table` evaluates the
table for both settings of scaleInProtection and returns its problems.
"""

from __future__ import annotations

import dataclasses
import operator
import pathlib
import re
from typing import Any

import bicep_model

COMPARE = {
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "Equals": operator.eq,
    "NotEquals": operator.ne,
}

AGGREGATE = {
    "Average": lambda xs: sum(xs) / len(xs),
    "Maximum": max,
    "Minimum": min,
    "Total": sum,
    "Last": lambda xs: xs[-1],
    "Count": len,
}

READINGS = ("total", "per instance", "divided twice")
# Readings under which a backlog above the threshold must scale out.
SCALE_OUT_READINGS = ("total", "per instance")


@dataclasses.dataclass(frozen=True)
class Rule:
    metric: str
    time_window_minutes: int
    time_aggregation: str
    operator: str
    threshold: float
    divide_per_instance: bool
    direction: str
    action_type: str
    value: int


@dataclasses.dataclass(frozen=True)
class Profile:
    minimum: int
    maximum: int
    default: int
    rules: tuple[Rule, ...]


@dataclasses.dataclass(frozen=True)
class Case:
    """The queue as the metric sees it for the last `minutes` minutes."""

    name: str
    backlog: int  # visible messages waiting
    in_flight: int  # invisible: received by a worker, not yet deleted
    instances: int
    earlier_total: int | None = None  # a higher count seen earlier in the window
    metric_missing: bool = False
    # VMs holding a message (protected where the workers protect); None:
    # one message each, as many as there are.
    busy_vms: int | None = None
    # Idle VMs still in their idle grace (protected too).
    in_grace: int = 0

    @property
    def total(self) -> int:
        return self.backlog + self.in_flight

    @property
    def busy(self) -> int:
        return min(self.in_flight, self.instances) if self.busy_vms is None else self.busy_vms

    @property
    def unprotected(self) -> int:
        """Idle VMs past their grace: the only ones a scale-in may take
        while the workers protect themselves."""
        return max(0, self.instances - self.busy - self.in_grace)

    def samples(self, minutes: int) -> list[int]:
        """One metric sample per minute, oldest first."""
        if self.earlier_total is None:
            return [self.total] * minutes
        return [self.earlier_total] + [self.total] * (minutes - 1)


def decide(profile: Profile, case: Case, reading: str) -> int:
    """The instance count autoscale moves to."""
    current = case.instances
    if case.metric_missing:
        return max(current, profile.default)
    fired = {rule: fires(rule, case, reading) for rule in profile.rules}
    out = [rule for rule in profile.rules if rule.direction == "Increase" and fired[rule]]
    scale_in = [rule for rule in profile.rules if rule.direction == "Decrease"]
    if out:
        target = max(apply(rule, current) for rule in out)
    elif scale_in and all(fired[rule] for rule in scale_in):
        target = min(apply(rule, current) for rule in scale_in)
    else:
        target = current
    return min(max(target, profile.minimum), profile.maximum)


def fires(rule: Rule, case: Case, reading: str) -> bool:
    if rule.metric != "ApproximateMessageCount":
        raise ValueError(f"the model knows only the queue metric, not {rule.metric}")
    value = AGGREGATE[rule.time_aggregation](case.samples(rule.time_window_minutes))
    divisions = {
        "total": int(rule.divide_per_instance),
        "per instance": 1,
        "divided twice": 1 + int(rule.divide_per_instance),
    }[reading]
    if divisions and case.instances == 0:
        raise ValueError("a per-instance queue metric with zero instances is not documented")
    value = value / case.instances ** divisions
    return COMPARE[rule.operator](value, rule.threshold)


def apply(rule: Rule, current: int) -> int:
    sign = 1 if rule.direction == "Increase" else -1
    if rule.action_type == "ChangeCount":
        return current + sign * rule.value
    if rule.action_type == "ExactCount":
        return rule.value
    if rule.action_type == "PercentChangeCount":
        return current + sign * max(1, current * rule.value // 100)
    raise ValueError(f"unknown scale action type {rule.action_type}")


# -- rendering from bicep/ ---------------------------------------------------


def render(bicep_dir: pathlib.Path, overrides: dict[str, Any] | None = None) -> tuple[Profile, dict[str, Any]]:
    """The profile modules/autoscale.bicep deploys with main.bicepparam's
    values (main.bicep's parameters, `overrides` on top)."""
    _, given = bicep_model.load_bicepparam(bicep_dir / "main.bicepparam")
    main = bicep_model.load(bicep_dir / "main.bicep")
    main_values = {name: p.default for name, p in main.params.items() if p.has_default}
    main_values.update(given)
    main_values.update(overrides or {})
    call = main.modules["autoscale"]
    module = bicep_model.load(call.path)
    values = {name: p.default for name, p in module.params.items() if p.has_default}
    for name, value in call.params.items():
        if isinstance(value, str) and value in main_values:
            values[name] = main_values[value]
        elif isinstance(value, (int, bool)):
            values[name] = value
    # The module's vars (the rules), evaluated lazily as expressions.
    variables = {name: ("var", expr) for name, expr in module.variables.items()}
    body = module.resources["autoscale"].body["properties"]
    (profile,) = body["profiles"]
    scope = {**variables, **values}
    rules = tuple(render_rule(resolve(rule, scope), scope) for rule in resolve(profile["rules"], scope))
    capacity = {k: int(evaluate(v, scope)) for k, v in profile["capacity"].items()}
    return Profile(capacity["minimum"], capacity["maximum"], capacity["default"], rules), values


def resolve(value: Any, values: dict[str, Any]) -> Any:
    """A var's or a ternary's value (rules are picked by a conditional
    over vars), left as the body it is otherwise."""
    if isinstance(value, str) and isinstance(values.get(value), tuple) and values[value][0] == "var":
        return resolve(values[value][1], values)
    if bicep_model.is_call(value) and "operator" in value and value["operator"]["type"] == "conditional":
        operands = value["operator"]["operands"]
        chosen = "true_value" if evaluate(operands["condition"], values) else "false_value"
        return resolve(operands[chosen], values)
    if isinstance(value, list):
        return [resolve(item, values) for item in value]
    return value


# Azure's bounds on a metric trigger's timeWindow (MetricTrigger in the
# Microsoft.Insights 2022-10-01 schema: "Must be between 12 hours and 5
# minutes"); the type library only says "string", so a deployment with a
# shorter window parses and is refused by Azure.
WINDOW_MINUTES = (5, 12 * 60)


def window_problems(profile: "Profile", where: str) -> list[str]:
    """Rules whose time window Azure refuses."""
    low, high = WINDOW_MINUTES
    return [
        f"{where}: a {rule.direction} rule on {rule.metric} has a {rule.time_window_minutes}-minute window; "
        f"Azure takes {low} minutes to {high // 60} hours"
        for rule in profile.rules
        if not low <= rule.time_window_minutes <= high
    ]


def render_rule(rule: dict, values: dict[str, Any]) -> Rule:
    trigger, action = rule["metricTrigger"], rule["scaleAction"]
    return Rule(
        metric=evaluate(trigger["metricName"], values),
        time_window_minutes=minutes(evaluate(trigger["timeWindow"], values)),
        time_aggregation=evaluate(trigger["timeAggregation"], values),
        operator=evaluate(trigger["operator"], values),
        threshold=float(evaluate(trigger["threshold"], values)),
        divide_per_instance=bool(evaluate(trigger.get("dividePerInstance", False), values)),
        direction=evaluate(action["direction"], values),
        action_type=evaluate(action["type"], values),
        value=int(evaluate(action.get("value", "1"), values)),
    )


def evaluate(value: Any, values: dict[str, Any]) -> Any:
    """The few expressions autoscale.bicep uses; anything else is an error."""
    if isinstance(value, str) and value in values:
        found = values[value]
        if isinstance(found, tuple) and found[0] == "var":
            return evaluate(found[1], values)
        return found
    if bicep_model.is_interpolated(value):
        def substitute(match: re.Match) -> str:
            name = match.group(1)
            if name not in values:
                raise ValueError(f"autoscale_model cannot evaluate {value!r}: {name} is not a parameter")
            return str(evaluate(name, values))
        return re.sub(r"\$\{(\w+)\}", substitute, value)
    if bicep_model.is_call(value) and "function" in value:
        function = value["function"]
        args = [evaluate(arg, values) for arg in function["parameters"].values()]
        if function["type"] == "string":
            return str(args[0])
        if function["type"] == "int":
            return int(args[0])
        if function["type"] in ("max", "min"):
            return (max if function["type"] == "max" else min)(*args)
    if bicep_model.is_call(value) or bicep_model.is_interpolated(value):
        raise ValueError(f"autoscale_model cannot evaluate {value!r}: extend evaluate()")
    return value


def minutes(duration: str) -> int:
    m = re.fullmatch(r"PT(?:(\d+)H)?(?:(\d+)M)?", duration)
    if not m:
        raise ValueError(f"unsupported ISO 8601 duration {duration}")
    return int(m.group(1) or 0) * 60 + int(m.group(2) or 0)


# -- the table ---------------------------------------------------------------


def cases(profile: Profile, backlog_per_instance: int) -> list[Case]:
    low, high = profile.minimum, profile.maximum
    busy = backlog_per_instance * 3
    return [
        Case("idle at the minimum", 0, 0, low),
        Case("idle above the minimum", 0, 0, low + 3),
        Case("last job still running", 0, 1, low + 3),
        Case("a few jobs running, none waiting", 0, 3, low + 3),
        Case("fewer messages than instances", 1, 1, low + 4),
        Case("one in flight per instance", 0, low + 2, low + 2),
        Case("drained a minute ago", 0, 0, low + 3, earlier_total=5),
        Case("small backlog", 3, 2, low + 1),
        Case("backlog above the threshold", busy * (low + 1), low + 1, low + 1),
        Case("backlog above the threshold, more instances", (backlog_per_instance + 10) * (low + 4), low + 4, low + 4),
        Case("backlog at the maximum", busy * high, high, high),
        Case("metrics missing, above default", 0, 2, low + 3, metric_missing=True),
        # The batch's tail: a few long jobs left on a large fleet.
        Case("long tail, most VMs idle", 0, 3, high),
        Case("long tail, idle VMs still in their grace", 0, 3, high, in_grace=high - 4),
        Case("one busy VM holding two messages", 0, 2, low + 3, busy_vms=1),
        Case("every VM busy, fewer messages than VMs", 0, low + 1, low + 2, busy_vms=low + 2),
    ]


def run_table(bicep_dir: pathlib.Path) -> tuple[list[list[str]], list[str]]:
    """The table for the rules bicep/ deploys, with and without the
    workers' protection: (rows, problems)."""
    rows, problems = [], []
    for protection in (True, False):
        profile, values = render(bicep_dir, {"scaleInProtection": protection})
        prompt = prompt_rule(profile)
        if protection != (prompt is not None):
            problems.append(f"scaleInProtection={str(protection).lower()}: the prompt scale-in rule is "
                            f"{'missing' if protection else 'deployed without the workers protecting their VMs'}")
        table, found = evaluate_table(profile, int(values.get("backlogPerInstance", 1)), protection)
        setting = "protected" if protection else "unprotected"
        rows += [[setting, *row] for row in table]
        problems += [f"{setting}: {problem}" for problem in found]
        problems += window_problems(profile, f"modules/autoscale.bicep ({setting})")
    return rows, problems + wiring_problems(bicep_dir)


def prompt_rule(profile: Profile) -> Rule | None:
    """The scale-in rule that may fire while messages are held (fewer than
    one per instance), if the profile has one."""
    found = [rule for rule in profile.rules
             if rule.direction == "Decrease" and rule.operator == "LessThan" and rule.threshold >= 1]
    return found[0] if found else None


def wiring_problems(bicep_dir: pathlib.Path) -> list[str]:
    """main.bicep drives the worker's setting (both lanes' scale sets), the
    role and the prompt rule from the one parameter scaleInProtection."""
    main = bicep_model.load(bicep_dir / "main.bicep")
    problems = []
    if "scaleInProtection" not in main.params:
        return ["main.bicep has no parameter scaleInProtection"]
    setting = {"operator": {"type": "conditional", "operands": {
        "condition": "scaleInProtection", "true_value": "on", "false_value": "off"}}}
    for symbol in ("compute", "regularCompute"):
        call = main.modules.get(symbol)
        if call is None or call.params.get("scaleInProtection") != setting:
            problems.append(f"main.bicep: module {symbol} must get scaleInProtection: "
                            "scaleInProtection ? 'on' : 'off' (SPOT_WORKER_SCALE_IN_PROTECTION in worker.env)")
    call = main.modules.get("autoscale")
    if call is None or call.params.get("scaleInProtection") != "scaleInProtection":
        problems.append("main.bicep: module autoscale must get scaleInProtection: scaleInProtection "
                        "(the prompt rule only with the workers' protection)")
    role = main.raw.get("modules", {}).get("scaleInProtectionRole", {})
    if "scaleInProtection" not in repr(role.get("config", {}).get("condition", role)):
        problems.append("main.bicep: module scaleInProtectionRole must be deployed if scaleInProtection")
    env = (bicep_dir / "cloud-init" / "worker.env").read_text()
    if "SPOT_WORKER_SCALE_IN_PROTECTION={{scaleInProtection}}" not in env:
        problems.append("cloud-init/worker.env must set SPOT_WORKER_SCALE_IN_PROTECTION={{scaleInProtection}}")
    compute = (bicep_dir / "modules" / "compute.bicep").read_text()
    if "'{{scaleInProtection}}', scaleInProtection)" not in compute:
        problems.append("modules/compute.bicep must fill {{scaleInProtection}} from its parameter scaleInProtection")
    return problems


def removals(case: Case, after: int, protection: bool) -> tuple[int, int]:
    """(idle VMs removed, busy VMs removed) by a scale-in to `after`, as
    Azure documents it: protected VMs are not considered, so with the
    workers' protection only idle VMs past their grace go (at most as many
    as there are: the bench's assumption for a scale-in asking for more);
    without it, any VM may go, busy ones included."""
    asked = max(0, case.instances - after)
    if protection:
        return min(asked, case.unprotected), 0
    idle = case.instances - case.busy
    return min(asked, idle), max(0, asked - idle)


def old_scale_in(profile: Profile) -> Profile:
    """The same profile with the scale-in rule this project used to have
    ("maximum over 10 minutes < 1"): the table must catch it (negative control)."""
    rules = tuple(
        dataclasses.replace(rule, operator="LessThan", threshold=1, time_window_minutes=10)
        if rule.direction == "Decrease" else rule
        for rule in profile.rules
    )
    return dataclasses.replace(profile, rules=rules)


def evaluate_table(profile: Profile, per_instance: int, protection: bool = False) -> tuple[list[list[str]], list[str]]:
    problems = [] if profile.minimum >= 1 else [
        "minInstances 0: waking from zero instances needs the per-instance queue metric divided by zero, "
        "which Azure does not document; keep the minimum at 1 or more (see bicep/README.md)"
    ]
    rows = []
    step = max((rule.value for rule in profile.rules
                if rule.direction == "Decrease" and rule.action_type == "ChangeCount"), default=None)
    for case in cases(profile, per_instance):
        outcomes = {reading: decide(profile, case, reading) for reading in READINGS}
        for reading, after in outcomes.items():
            if protection:
                problems += prompt_case_problems(case, reading, after, profile, per_instance, step)
            else:
                problems += case_problems(case, reading, after, profile, per_instance)
        gone = removals(case, outcomes["per instance"], protection)
        rows.append([case.name, str(case.backlog), str(case.in_flight), str(case.busy), str(case.instances),
                     "missing" if case.metric_missing else str(case.total),
                     *(str(outcomes[r]) for r in READINGS), f"{gone[0]} idle, {gone[1]} busy"])
    return rows, problems


def case_problems(case: Case, reading: str, after: int, profile: Profile, per_instance: int) -> list[str]:
    problems = []
    if after < case.instances and case.total > 0:
        problems.append(f"'{case.name}' ({reading}): {case.instances} -> {after} instances while "
                        f"{case.total} messages are held or waiting: a busy worker could be deleted")
    if after < case.instances and case.earlier_total:
        problems.append(f"'{case.name}' ({reading}): scaled in although the window saw "
                        f"{case.earlier_total} messages")
    backlog_each = case.backlog / case.instances
    if (reading in SCALE_OUT_READINGS and not case.metric_missing and backlog_each > per_instance
            and case.instances < profile.maximum and after <= case.instances):
        problems.append(f"'{case.name}' ({reading}): a backlog of {case.backlog} "
                        f"({backlog_each:.0f} per instance) does not scale out")
    return problems


def prompt_case_problems(case: Case, reading: str, after: int, profile: Profile, per_instance: int,
                         step: int | None) -> list[str]:
    """With the workers' protection: idle VMs go, busy ones never, never
    below the minimum, nothing while every instance has a message, at most
    a step at once."""
    problems = []
    idle_removed, busy_removed = removals(case, after, True)
    where = f"'{case.name}' ({reading})"
    if busy_removed:
        problems.append(f"{where}: {busy_removed} busy VMs removed")
    if after < profile.minimum:
        problems.append(f"{where}: {case.instances} -> {after}, below the minimum {profile.minimum}")
    if after < case.instances and (step is None or case.instances - after > step):
        problems.append(f"{where}: {case.instances - after} instances asked to go at once, more than a step "
                        f"({step}): if Azure took protected VMs when too few are unprotected, the harm is unbounded")
    documented = reading in SCALE_OUT_READINGS and not case.metric_missing
    if documented and case.total >= case.instances and after < case.instances:
        problems.append(f"{where}: scaled in with {case.total} messages for {case.instances} instances")
    idle_past_grace = case.unprotected > 0 and case.instances > profile.minimum
    if documented and idle_past_grace and case.total < case.instances and not case.earlier_total and idle_removed == 0:
        problems.append(f"{where}: {case.unprotected} idle VMs past their grace and fewer messages "
                        f"({case.total}) than instances, but none removed")
    backlog_each = case.backlog / case.instances
    if (documented and backlog_each > per_instance and case.instances < profile.maximum
            and after <= case.instances):
        problems.append(f"{where}: a backlog of {case.backlog} ({backlog_each:.0f} per instance) does not scale out")
    return problems


def format_table(rows: list[list[str]]) -> list[str]:
    header = ["workers", "case", "backlog", "in flight", "busy VMs", "instances", "metric",
              *(f"after ({r})" for r in READINGS), "removed (per instance)"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return lines
