//! The one switch `scaleInProtection` of `bicep/main.bicep`, as the VM and
//! autoscale get it: the worker's `SPOT_WORKER_SCALE_IN_PROTECTION` (through
//! `modules/compute.bicep`'s `replace()` chain into `worker.env`) and the
//! scale-in rule of `modules/autoscale.bicep`. The prompt rule removes VMs
//! while jobs run, which is safe only when every worker protects its own VM,
//! so the two must come together (bicep/README.md, "Instance protection").
//! Read from the templates' text, as the rest of this module reads them;
//! `tools/infra/autoscale_model.py` checks the rule's behaviour.

use std::path::Path;

/// What `main.bicep` hands each scale set's `modules/compute.bicep` as its
/// `scaleInProtection` when its own parameter is `enabled` (the Spot lane's
/// and the regular lane's), and whether `modules/autoscale.bicep` then
/// deploys the prompt scale-in rule.
pub struct ScaleInSwitch {
    pub per_scale_set: Vec<String>,
    pub prompt_rule: bool,
}

pub fn scale_in_switch(repo: &Path, enabled: bool) -> ScaleInSwitch {
    let main = std::fs::read_to_string(repo.join("bicep/main.bicep")).unwrap();
    let per_scale_set = main
        .lines()
        .filter_map(|line| line.trim().strip_prefix("scaleInProtection: "))
        .filter(|expr| expr.contains('?'))
        .map(|expr| ternary(expr, "scaleInProtection", enabled))
        .collect();
    let autoscale = std::fs::read_to_string(repo.join("bicep/modules/autoscale.bicep")).unwrap();
    let (when_on, when_off) = rules_by_switch(&autoscale);
    let chosen = if enabled { when_on } else { when_off };
    ScaleInSwitch {
        per_scale_set,
        prompt_rule: chosen.iter().any(|rule| rule == "promptScaleIn"),
    }
}

/// `COND ? 'a' : 'b'` with `COND` the parameter `param`, evaluated.
fn ternary(expr: &str, param: &str, value: bool) -> String {
    let (condition, branches) = expr.split_once(" ? ").expect("COND ? 'a' : 'b'");
    assert_eq!(condition.trim(), param, "{expr}: a ternary over {param}");
    let (on, off) = branches.split_once(" : ").expect("COND ? 'a' : 'b'");
    let literal = |s: &str| {
        s.trim()
            .strip_prefix('\'')
            .and_then(|s| s.strip_suffix('\''))
            .unwrap_or_else(|| panic!("{expr}: a string literal, not {s}"))
            .to_owned()
    };
    if value { literal(on) } else { literal(off) }
}

/// The rule names of `rules: scaleInProtection ? [ … ] : [ … ]`.
fn rules_by_switch(autoscale: &str) -> (Vec<String>, Vec<String>) {
    let mut lines = autoscale
        .lines()
        .map(str::trim)
        .skip_while(|line| *line != "rules: scaleInProtection ? [");
    assert!(
        lines.next().is_some(),
        "modules/autoscale.bicep picks its rules by `rules: scaleInProtection ? [`"
    );
    let on: Vec<String> = lines
        .by_ref()
        .take_while(|line| *line != "] : [")
        .map(str::to_owned)
        .collect();
    let off: Vec<String> = lines
        .take_while(|line| *line != "]")
        .map(str::to_owned)
        .collect();
    (on, off)
}
