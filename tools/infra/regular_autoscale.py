"""The regular lane's autoscale, rendered from bicep/ and evaluated on a table.

modules/regular-autoscale.bicep scales the regular lane's scale set from
zero (docs/deploying.md, "The two lanes"): a VM per job on the regular queue, and one VM to keep
the lanes while no Spot VM runs. Unlike the Spot scale set (autoscale_model),
its minimum is 0, and two of its rules read a metric of another resource:
the Spot scale set's Percentage CPU sample count, which is zero (or missing)
only when no Spot VM runs. Azure's documentation leaves three readings open,
and every case is evaluated under each combination (bicep/README.md, "The
regular lane's autoscale", says how to tell on a real subscription):

- the per-instance queue metric, as in autoscale_model: "total", "per
  instance" or "divided twice";
- that metric at zero instances: "infinite" (a count divided by zero), "by
  one", or "skipped" (the rule is not evaluated);
- the Spot scale set without VMs: "count 0", or "missing": no data, so its
  rules do not fire and the profile's default capacity applies (only if the
  scale set has fewer: Azure, "Autoscale settings": default is the count
  used when metrics are not available);
- a scale-out rule that fires but changes nothing ("increase count to 1" at
  one VM): "out wins" (no scale-in is considered), or "then in" (the
  scale-in rules are evaluated as if no scale-out rule had fired).

A per-instance reading at zero instances that skips the rule is evaluated
only where dividePerInstance asks for the division ("total"): if Azure both
divides the queue metric whatever dividePerInstance says and skips such a
rule at zero instances, nothing wakes the pool from zero. bicep/README.md
says how to check that on a subscription, and regularMinInstances=1 is the
way out.

"Increase count to N" (direction Increase, type ExactCount) is read as the
portal names it: up to N, never down.

What must hold, under every reading: no scale-in while a regular message is
held or waiting; a job in the regular lane wakes a VM from zero; no Spot VM
for the keeper's window wakes exactly one VM, which stays (no flapping) while
Spot stays away; an idle regular lane with Spot running goes to zero and
stays there; a backlog with every VM busy scales out (under the readings
that divide once, as for the Spot lane).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
import re
from typing import Any

import autoscale_model
import bicep_model

QUEUE_READINGS = autoscale_model.READINGS
ZERO_READINGS = ("infinite", "by one", "skipped")
SPOT_READINGS = ("count 0", "missing")
NOOP_READINGS = ("out wins", "then in")
QUEUE_METRIC = "ApproximateMessageCount"
SPOT_METRIC = "Percentage CPU"


# The rules and profile are autoscale_model's: one model of a rule, read
# the same way for both lanes.
Rule = autoscale_model.Rule
Profile = autoscale_model.Profile


@dataclasses.dataclass(frozen=True)
class Case:
    """The last minutes as the metrics see them."""

    name: str
    waiting: int  # regular-lane messages visible
    running: int  # regular-lane messages held by a worker
    instances: int  # regular VMs
    spot: int  # Spot VMs reporting samples now
    spot_earlier: int | None = None  # Spot VMs at the start of every window
    queue_earlier: int | None = None  # regular messages at the start of every window
    expected: tuple[int | None, int | None] = (None, None)  # bounds on the result, if any

    def queue_samples(self, minutes: int) -> list[int]:
        total = self.waiting + self.running
        first = total if self.queue_earlier is None else self.queue_earlier
        return [first] + [total] * (minutes - 1)

    def spot_samples(self, minutes: int) -> list[int]:
        first = self.spot if self.spot_earlier is None else self.spot_earlier
        return [first] + [self.spot] * (minutes - 1)


def render(bicep_dir: pathlib.Path) -> Profile:
    """The profile modules/regular-autoscale.bicep deploys with main.bicepparam's values."""
    _, given = bicep_model.load_bicepparam(bicep_dir / "main.bicepparam")
    main = bicep_model.load(bicep_dir / "main.bicep")
    main_values: dict[str, Any] = {name: p.default for name, p in main.params.items() if p.has_default}
    main_values.update(given)
    call = main.modules["regularAutoscale"]
    module = bicep_model.load(call.path)
    values: dict[str, Any] = {name: p.default for name, p in module.params.items() if p.has_default}
    for name, value in call.params.items():
        if isinstance(value, str) and value in main_values:
            values[name] = main_values[value]
        elif isinstance(value, (int, bool)):
            values[name] = value
    (profile,) = module.resources["autoscale"].body["properties"]["profiles"]
    rules = []
    for rule in profile["rules"]:
        # The one interpolation the module uses is rendered first; the
        # rest is read as the Spot lane's autoscale is.
        trigger = dict(rule["metricTrigger"], timeWindow=render_window(rule["metricTrigger"]["timeWindow"], values))
        rules.append(autoscale_model.render_rule(dict(rule, metricTrigger=trigger), values))
    capacity = {k: int(autoscale_model.evaluate(v, values)) for k, v in profile["capacity"].items()}
    return Profile(capacity["minimum"], capacity["maximum"], capacity["default"], tuple(rules))


def render_window(expr: Any, values: dict[str, Any]) -> str:
    """A time window: a literal, or `'PT${keeperWakeMinutes}M'` (the one
    interpolation the module uses: parameters only)."""
    if not (isinstance(expr, str) and bicep_model.is_interpolated(expr)):
        return autoscale_model.evaluate(expr, values)
    text = re.sub(r"\$\{(\w+)\}", lambda m: str(values[m.group(1)]), expr)
    if "${" in text:
        raise ValueError(f"regular_autoscale cannot evaluate the time window {expr!r}")
    return text


def decide(profile: Profile, case: Case, queue: str, zero: str | None, spot: str | None, noop: str) -> int:
    """The instance count autoscale moves to under one combination of readings."""
    current = case.instances
    fired = {rule: fires(rule, case, queue, zero, spot) for rule in profile.rules}
    out = [r for r in profile.rules if r.direction == "Increase" and fired[r]]
    scale_in = [r for r in profile.rules if r.direction == "Decrease"]
    grown = max((apply(r, current) for r in out), default=current)
    if out and (grown != current or noop == "out wins"):
        target = grown
    elif scale_in and all(fired[r] for r in scale_in):
        target = min(apply(r, current) for r in scale_in)
    else:
        target = current
    if spot == "missing":
        target = max(target, profile.default)
    return min(max(target, profile.minimum), profile.maximum)


def fires(rule: Rule, case: Case, queue: str, zero: str | None, spot: str | None) -> bool:
    aggregate = autoscale_model.AGGREGATE[rule.time_aggregation]
    if rule.metric == SPOT_METRIC:
        if rule.divide_per_instance:
            raise ValueError("the Spot VMs' sample count is never divided by the regular VMs")
        samples = case.spot_samples(rule.time_window_minutes)
        if spot == "missing" and 0 in samples:
            return False
        value = float(aggregate(samples))
    elif rule.metric == QUEUE_METRIC:
        value = float(aggregate(case.queue_samples(rule.time_window_minutes)))
        divisions = {"total": int(rule.divide_per_instance), "per instance": 1, "divided twice": 1 + int(rule.divide_per_instance)}[queue]
        if divisions and case.instances == 0:
            if zero == "skipped":
                return False
            # 0 / 0 waits for nothing; n / 0 is infinite, or read as n / 1.
            value = 0.0 if value == 0 else (math.inf if zero == "infinite" else value)
        elif divisions:
            value = value / case.instances ** divisions
    else:
        raise ValueError(f"the model knows the queue metric and the Spot VMs' CPU samples, not {rule.metric}")
    return autoscale_model.COMPARE[rule.operator](value, rule.threshold)


def apply(rule: Rule, current: int) -> int:
    if rule.action_type == "ExactCount":
        # "Increase count to" / "Decrease count to".
        return max(current, rule.value) if rule.direction == "Increase" else min(current, rule.value)
    return autoscale_model.apply(rule, current)


def cases(profile: Profile, keeper_window: int) -> list[Case]:
    high = profile.maximum
    return [
        Case("at rest: Spot runs, nothing regular", 0, 0, 0, 3, expected=(0, 0)),
        Case("a job sent to the regular lane", 1, 0, 0, 3, expected=(1, None)),
        Case("three jobs sent, no VM yet", 3, 0, 0, 3, expected=(1, None)),
        Case("one job running on its VM", 0, 1, 1, 3, expected=(1, None)),
        Case("every VM busy, two more waiting", 2, 3, 3, 3, expected=(3, None)),
        Case("fewer jobs than VMs", 0, 2, 3, 3, expected=(3, None)),
        Case("the last job finished a minute ago", 0, 0, 2, 3, queue_earlier=1, expected=(2, None)),
        Case("idle for 15 minutes, Spot runs", 0, 0, 2, 3, expected=(0, 0)),
        Case(f"no Spot VM for {keeper_window} minutes, none regular", 0, 0, 0, 0, expected=(1, 1)),
        Case("the keeper's VM while Spot stays away", 0, 0, 1, 0, expected=(1, 1)),
        Case("Spot back minutes ago, the keeper's VM idle", 0, 0, 1, 2, spot_earlier=0, expected=(1, 1)),
        Case("Spot back for 15 minutes, the keeper's VM idle", 0, 0, 1, 2, expected=(0, 0)),
        Case("Spot away for less than the keeper's window", 0, 0, 0, 0, spot_earlier=2, expected=(0, 1)),
        Case("Spot away, regular jobs running", 0, 2, 2, 0, expected=(2, None)),
        Case("Spot away, jobs moved to the regular lane", 4, 0, 1, 0, expected=(2, None)),
        Case("backlog at the maximum", 10, high, high, 3, expected=(high, high)),
    ]


def readings(case: Case) -> list[tuple[str, str | None, str | None, str]]:
    combos = []
    for queue in QUEUE_READINGS:
        zeros: tuple[str | None, ...] = (None,)
        if case.instances == 0:
            zeros = ZERO_READINGS if queue == "total" else ("infinite", "by one")
        spots: tuple[str | None, ...] = SPOT_READINGS if 0 in (case.spot, case.spot_earlier) else (None,)
        combos += itertools.product((queue,), zeros, spots, NOOP_READINGS)
    return combos


def run_table(bicep_dir: pathlib.Path) -> tuple[list[list[str]], list[str]]:
    profile = render(bicep_dir)
    problems = autoscale_model.window_problems(profile, "modules/regular-autoscale.bicep")
    keeper = next((r.time_window_minutes for r in profile.rules if r.metric == SPOT_METRIC and r.direction == "Increase"), None)
    if keeper is None:
        problems.append("no rule wakes a regular VM when no Spot VM runs: nobody keeps the lanes then")
        keeper = 0
    rows = []
    for case in cases(profile, keeper):
        outcomes = {combo: decide(profile, case, *combo) for combo in readings(case)}
        for combo, after in outcomes.items():
            problems += case_problems(case, combo, after, profile)
        low, high = min(outcomes.values()), max(outcomes.values())
        rows.append([case.name, str(case.waiting), str(case.running), str(case.instances), str(case.spot),
                     str(low) if low == high else f"{low}-{high}", str(len(outcomes))])
    return rows, problems


def case_problems(case: Case, combo: tuple[str, str | None, str | None, str], after: int, profile: Profile) -> list[str]:
    reading = ", ".join(r for r in combo if r)
    problems = []
    held = case.waiting + case.running
    if after < case.instances and held > 0:
        problems.append(f"'{case.name}' ({reading}): {case.instances} -> {after} regular VMs while {held} "
                        "regular messages are held or waiting")
    # A minimum above zero (regularMinInstances) raises every bound.
    low, high = (None if b is None else max(b, profile.minimum) for b in case.expected)
    if low is not None and after < low:
        problems.append(f"'{case.name}' ({reading}): {after} regular VMs, expected at least {low}")
    if high is not None and after > high:
        problems.append(f"'{case.name}' ({reading}): {after} regular VMs, expected at most {high}")
    busy = case.instances > 0 and case.running >= case.instances and case.waiting > 0
    if (busy and combo[0] in autoscale_model.SCALE_OUT_READINGS and case.instances < profile.maximum
            and after <= case.instances):
        problems.append(f"'{case.name}' ({reading}): every VM busy and {case.waiting} waiting, no scale-out")
    return problems


def format_table(rows: list[list[str]]) -> list[str]:
    header = ["case", "waiting", "running", "regular VMs", "Spot VMs", "after", "readings"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return lines


def without_spot_guard(profile: Profile) -> Profile:
    """The same profile without the scale-in rule on the Spot VMs (negative
    control: the keeper's VM must then be reported flapping)."""
    rules = tuple(r for r in profile.rules if not (r.direction == "Decrease" and r.metric == SPOT_METRIC))
    return dataclasses.replace(profile, rules=rules)
