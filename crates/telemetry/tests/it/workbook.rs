//! The dashboard in `bicep/workbook.json` queries only what the worker
//! emits: every quoted name in its KQL is a metric from [`names::ALL`], an
//! attribute key from [`attributes::ALL`] (as `customDimensions['key']`) or
//! a value such an attribute takes ([`values`]). A renamed metric or a
//! mistyped outcome would otherwise draw an empty panel without a word.
//! Failures are plotted apart from evictions and releases.

use std::path::Path;

use spot_worker_telemetry::{attributes, names, values};

fn workbook_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bicep/workbook.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every KQL query in the workbook.
fn queries(workbook: &str) -> Vec<String> {
    let json: serde_json::Value = serde_json::from_str(workbook).expect("the workbook is JSON");
    json["items"]
        .as_array()
        .expect("the workbook has items")
        .iter()
        .filter_map(|item| item["content"]["query"].as_str().map(str::to_owned))
        .collect()
}

/// The single-quoted literals of a KQL query (the only quoting it uses).
fn literals(query: &str) -> Vec<&str> {
    query.split('\'').skip(1).step_by(2).collect()
}

/// What in `query` the worker does not emit, one line each.
fn unknown_names(query: &str) -> Vec<String> {
    let mut known: Vec<&str> = names::ALL.to_vec();
    known.extend(attributes::ALL);
    known.extend(attributes::ALL.iter().flat_map(|key| values(key)));
    let mut mistakes: Vec<String> = literals(query)
        .into_iter()
        .filter(|literal| !known.contains(literal))
        .map(|literal| format!("'{literal}' is no metric, attribute or value the worker emits"))
        .collect();
    // customDimensions.key (no quotes) would slip past the literals.
    if query.contains("customDimensions.") {
        mistakes.push("use customDimensions['key'], so the key is checked".to_owned());
    }
    mistakes
}

fn workbook_mistakes(workbook: &str) -> Vec<String> {
    queries(workbook)
        .iter()
        .flat_map(|query| unknown_names(query))
        .collect()
}

#[test]
fn every_name_the_workbook_queries_is_one_the_worker_emits() {
    let workbook = workbook_text();
    assert!(queries(&workbook).len() >= 6, "the KQL panels are found");
    let mistakes = workbook_mistakes(&workbook);
    assert!(mistakes.is_empty(), "{mistakes:#?}");
}

#[test]
fn the_check_finds_planted_mistakes() {
    let workbook = workbook_text();
    // (what is planted, replaced, by)
    let planted = [
        (
            "a retired metric",
            "'spot_worker.messages.failed'",
            "'spot_worker.messages.processed'",
        ),
        (
            "an attribute key the worker does not set",
            "customDimensions['outcome']",
            "customDimensions['result_kind']",
        ),
        ("a mistyped outcome", "'released'", "'relased'"),
        (
            "an unquoted key",
            "customDimensions['messaging.destination.name']",
            "customDimensions.queue",
        ),
    ];
    for (what, from, to) in planted {
        assert!(
            workbook.contains(from),
            "{what}: the workbook has no {from}"
        );
        let mistakes = workbook_mistakes(&workbook.replace(from, to));
        assert!(!mistakes.is_empty(), "{what} went unnoticed");
    }
}

#[test]
fn failures_are_plotted_apart_from_evictions_and_releases() {
    let workbook = workbook_text();
    let queries = queries(&workbook);
    let failed = format!("'{}'", names::MESSAGES_FAILED);
    let failures: Vec<_> = queries.iter().filter(|q| q.contains(&failed)).collect();
    assert!(!failures.is_empty(), "a panel plots counted failures");
    for query in failures {
        let literals = literals(query);
        for outcome in ["released", "waited_for_peer", "waited_for_store"] {
            assert!(!literals.contains(&outcome), "{outcome} in {query}");
        }
        assert!(!literals.contains(&names::MESSAGES_SETTLED), "{query}");
    }
    let releases = queries
        .iter()
        .find(|q| literals(q).contains(&"released"))
        .expect("a panel plots releases (evictions)");
    assert!(literals(releases).contains(&names::MESSAGES_SETTLED));
}

#[test]
fn the_bill_is_drawn_by_lane_and_phase() {
    let workbook = workbook_text();
    let queries = queries(&workbook);
    let time = format!("'{}'", names::WORKER_TIME);
    let bill: Vec<_> = queries.iter().filter(|q| q.contains(&time)).collect();
    assert!(bill.len() >= 2, "a chart and a table of the bill");
    let by_lane = bill
        .iter()
        .find(|q| q.contains(&format!("customDimensions['{}']", attributes::LANE)))
        .expect("a panel splits the bill by lane");
    for phase in spot_worker_telemetry::WORKER_PHASES {
        assert!(
            literals(by_lane).contains(&phase),
            "{phase} is summed in {by_lane}"
        );
    }
    assert!(
        bill.iter()
            .any(|q| q.contains(&format!("customDimensions['{}']", attributes::PHASE)))
    );
}
