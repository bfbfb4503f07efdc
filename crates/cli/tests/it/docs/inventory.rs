//! What the docs list, held to the lists in the code: every relative link
//! and anchor resolves, configuration.md's metrics table is the metrics the
//! worker registers (`spot_worker_telemetry::names::ALL`), and storage.md's
//! "What stays" names every record the worker writes under `.spot-worker/`
//! (`spot_worker_storage::WORKER_RECORDS`, `spot_worker_azure::WORKER_RECORDS`).
//! Each list in the code is itself held to the sources: a metric name or a
//! `.spot-worker/` key written as a string literal anywhere else is one the
//! list is missing.

use std::collections::BTreeSet;
use std::path::Path;

use spot_worker::telemetry::{attributes, names};

use super::{blocks, facts, links, prose, session};

#[test]
fn every_relative_link_and_anchor_resolves() {
    let root = session::workspace_root();
    let mut problems = Vec::new();
    let (mut checked, mut anchored) = (0, 0);
    for page in blocks::pages(&root) {
        let relative = page.strip_prefix(&root).unwrap_or(&page).to_owned();
        let text = std::fs::read_to_string(&page).unwrap();
        let prose = prose::Prose::of(&relative, &text);
        for link in links::links(&prose) {
            if links::is_external(&link.target) {
                continue;
            }
            checked += 1;
            anchored += usize::from(link.target.contains('#'));
            if let Some(problem) = links::problem(&root, &relative, &link.target) {
                problems.push(format!(
                    "{}:{}: ({}): {problem}",
                    relative.display(),
                    link.line,
                    link.target
                ));
            }
        }
    }
    eprintln!("links: {checked} relative links resolved, {anchored} of them with an anchor");
    assert!(
        checked > 0,
        "no relative link found: is the pattern still the docs'?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The metrics table of docs/configuration.md (its rows whose first cell
/// names `spot_worker.` metrics) lists every metric of `names::ALL`, and
/// nothing else.
#[test]
fn the_metrics_table_is_the_metrics_the_worker_registers() {
    let root = session::workspace_root();
    let page = Path::new("docs/configuration.md");
    let text = std::fs::read_to_string(root.join(page)).unwrap();
    let mut documented = BTreeSet::new();
    for table in prose::Prose::of(page, &text).tables() {
        if table[0].1.first().is_none_or(|h| h != "metric") {
            continue;
        }
        for (_, row) in &table[1..] {
            let first = row.first().map(String::as_str).unwrap_or_default();
            documented.extend(
                first
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .filter(|n| n.starts_with("spot_worker."))
                    .map(str::to_owned),
            );
        }
    }
    let registered: BTreeSet<String> = names::ALL.iter().map(|n| (*n).to_owned()).collect();
    let mut problems = Vec::new();
    for missing in registered.difference(&documented) {
        problems.push(format!(
            "{}: the metrics table has no row for `{missing}`, which the worker registers \
             (spot_worker_telemetry::names::ALL): add one",
            page.display()
        ));
    }
    for unknown in documented.difference(&registered) {
        problems.push(format!(
            "{}: the metrics table lists `{unknown}`, which the worker does not register \
             (spot_worker_telemetry::names::ALL)",
            page.display()
        ));
    }
    let known: Vec<&str> = names::ALL.iter().chain(&attributes::ALL).copied().collect();
    problems.extend(
        literals(&root, "\"spot_worker.")
            .into_iter()
            .filter(|(_, literal)| !known.contains(&literal.as_str()))
            .map(|(at, literal)| {
                format!(
                    "{at}: \"{literal}\" is neither in names::ALL nor attributes::ALL \
                     (crates/telemetry/src/metrics.rs): add it there, and to the table"
                )
            }),
    );
    eprintln!(
        "metrics: {} registered, {} in the table of {}",
        registered.len(),
        documented.len(),
        page.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// docs/storage.md's "What stays" names every key the worker writes under
/// `.spot-worker/`.
#[test]
fn what_stays_names_every_record_the_worker_writes() {
    let root = session::workspace_root();
    let page = Path::new("docs/storage.md");
    let text = std::fs::read_to_string(root.join(page)).unwrap();
    let start = text
        .find("- **What is left in the checkpoint container")
        .expect("docs/storage.md has its \"What is left in the checkpoint container\" item");
    let end = text[start + 2..]
        .find("\n- ")
        .map_or(text.len(), |at| start + 2 + at);
    let stays = &text[start..end];
    let records: Vec<&str> = spot_worker::storage::WORKER_RECORDS
        .iter()
        .chain(&spot_worker::azure::WORKER_RECORDS)
        .copied()
        .collect();
    let mut problems: Vec<String> = records
        .iter()
        .filter(|key| !stays.contains(&format!("`{key}")))
        .map(|key| {
            format!(
                "{}: \"What stays\" does not name `{key}`, which the worker writes: say what \
                 it is and how long it stays",
                page.display()
            )
        })
        .collect();
    // The bare prefix is what listings leave out; anything longer written
    // as a literal is a record, which must be in the lists.
    problems.extend(
        literals(&root, "\".spot-worker/")
            .into_iter()
            .filter(|(_, literal)| {
                literal != ".spot-worker/" && !records.iter().any(|key| literal.starts_with(key))
            })
            .map(|(at, literal)| {
                format!(
                    "{at}: \"{literal}\" starts with none of the records listed in \
                     spot_worker_storage::WORKER_RECORDS or spot_worker_azure::WORKER_RECORDS: \
                     add its key there, and to docs/storage.md"
                )
            }),
    );
    eprintln!(
        "records: {} keys the worker writes under .spot-worker/, each named in \"What stays\"",
        records.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every string literal starting with `opening` (a `"` and its first
/// characters) in the Rust sources of the workspace's crates, with where.
fn literals(root: &Path, opening: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for dir in ["crates", "src"] {
        facts::visit(&root.join(dir), &mut |path, text| {
            if path.extension().is_none_or(|e| e != "rs")
                || path.starts_with(root.join("crates/cli/tests/it/docs"))
            {
                return;
            }
            for (at, _) in text.match_indices(opening) {
                let rest = &text[at + 1..];
                let literal = &rest[..rest.find('"').unwrap_or(rest.len())];
                let line = text[..at].lines().count();
                let file = path.strip_prefix(root).unwrap_or(path).display();
                found.push((format!("{file}:{line}"), literal.to_owned()));
            }
        });
    }
    found
}
