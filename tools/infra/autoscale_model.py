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

`render` reads the rules out of modules/autoscale.bicep with the parameter
values main.bicepparam gives (through main.bicep's module call); `decide` is
the pure decision; `run_table` evaluates the table and returns its problems.
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

    @property
    def total(self) -> int:
        return self.backlog + self.in_flight

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


def render(bicep_dir: pathlib.Path) -> tuple[Profile, dict[str, Any]]:
    """The profile modules/autoscale.bicep deploys with main.bicepparam's values."""
    _, given = bicep_model.load_bicepparam(bicep_dir / "main.bicepparam")
    main = bicep_model.load(bicep_dir / "main.bicep")
    main_values = {name: p.default for name, p in main.params.items() if p.has_default}
    main_values.update(given)
    call = main.modules["autoscale"]
    module = bicep_model.load(call.path)
    values = {name: p.default for name, p in module.params.items() if p.has_default}
    for name, value in call.params.items():
        if isinstance(value, str) and value in main_values:
            values[name] = main_values[value]
        elif isinstance(value, (int, bool)):
            values[name] = value
    body = module.resources["autoscale"].body["properties"]
    (profile,) = body["profiles"]
    rules = tuple(render_rule(rule, values) for rule in profile["rules"])
    capacity = {k: int(evaluate(v, values)) for k, v in profile["capacity"].items()}
    return Profile(capacity["minimum"], capacity["maximum"], capacity["default"], rules), values


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
        return values[value]
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
    ]


def run_table(bicep_dir: pathlib.Path) -> tuple[list[list[str]], list[str]]:
    """The table for the rules bicep/ deploys: (rows, problems)."""
    profile, values = render(bicep_dir)
    return evaluate_table(profile, int(values.get("backlogPerInstance", 1)))


def old_scale_in(profile: Profile) -> Profile:
    """The same profile with the scale-in rule this project used to have
    ("maximum over 10 minutes < 1"): the table must catch it (negative control)."""
    rules = tuple(
        dataclasses.replace(rule, operator="LessThan", threshold=1, time_window_minutes=10)
        if rule.direction == "Decrease" else rule
        for rule in profile.rules
    )
    return dataclasses.replace(profile, rules=rules)


def evaluate_table(profile: Profile, per_instance: int) -> tuple[list[list[str]], list[str]]:
    problems = [] if profile.minimum >= 1 else [
        "minInstances 0: waking from zero instances needs the per-instance queue metric divided by zero, "
        "which Azure does not document; keep the minimum at 1 or more (see bicep/README.md)"
    ]
    rows = []
    for case in cases(profile, per_instance):
        outcomes = {reading: decide(profile, case, reading) for reading in READINGS}
        for reading, after in outcomes.items():
            problems += case_problems(case, reading, after, profile, per_instance)
        rows.append([case.name, str(case.backlog), str(case.in_flight), str(case.instances),
                     "missing" if case.metric_missing else str(case.total),
                     *(str(outcomes[r]) for r in READINGS)])
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


def format_table(rows: list[list[str]]) -> list[str]:
    header = ["case", "backlog", "in flight", "instances", "metric", *(f"after ({r})" for r in READINGS)]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return lines
