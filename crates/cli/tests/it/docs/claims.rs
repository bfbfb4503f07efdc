//! What the prose of the docs claims, checked against the code: the
//! variables, setting values, defaults, flags and commands it quotes, the
//! glossary's words, and the doc runner's own counts (printed, never
//! written by hand).

use std::path::Path;

use super::{SPOT_WORKER, blocks, facts, help, prose, session, words};

/// Every variable, setting value, flag, `spot-worker` command and
/// repository path a sentence quotes (in backticks) exists: variables in
/// the settings table or the code, values that parse, flags of a command
/// (or a setting, a bench, another tool the docs name), commands the binary
/// has, paths in the clone.
#[test]
fn the_prose_quotes_only_what_exists() {
    let root = session::workspace_root();
    let mut checker = help::Checker::new(SPOT_WORKER);
    let facts = facts::Facts::gather(&root, &mut checker);
    let mut problems = Vec::new();
    let (mut variables, mut values, mut flags, mut commands, mut paths) = (0, 0, 0, 0, 0);
    for span in prose_spans(&root) {
        let text = span.text.as_str();
        // Variables, alone or as `NAME=value`.
        let name = text.split('=').next().unwrap_or_default().trim();
        let pattern = span.after.starts_with('*') || text.contains('*');
        for word in facts::upper_words(name).filter(|w| facts::is_variable(w)) {
            if pattern || word.ends_with('_') {
                continue;
            }
            variables += 1;
            if !facts.knows_variable(word) {
                problems.push(format!(
                    "{}: `{word}` is neither a setting (crates/settings/src/table.rs) nor a \
                     name the code uses: correct it, or add the setting",
                    span.at()
                ));
            }
        }
        // `KEY=value` and `key = "value"`: a value the setting takes.
        if let Some((key, value)) = text.split_once('=')
            && let Some(setting) = facts::setting_named(key.trim())
        {
            let value = value.trim().trim_matches('"');
            if !facts::is_placeholder(value) {
                values += 1;
                if let Err(why) = setting.check(value) {
                    problems.push(format!(
                        "{}: `{text}`: {value:?} is not a value of {}: {why}",
                        span.at(),
                        setting.key()
                    ));
                }
            }
        }
        // Flags: `--name`, `--name value`, `--name=value`.
        if let Some(flag) = text.strip_prefix("--")
            && flag.starts_with(|c: char| c.is_ascii_alphabetic())
        {
            let name = flag
                .split([' ', '='])
                .next()
                .unwrap_or_default()
                .trim_end_matches("...");
            flags += 1;
            if !facts.knows_flag(name) {
                problems.push(format!(
                    "{}: `--{name}` is not a flag of any `spot-worker` command (their --help), \
                     a setting, or a bench: correct it, or if it is another tool's, add it to \
                     OTHER_TOOLS_FLAGS in crates/cli/tests/it/docs/facts.rs with the tool",
                    span.at()
                ));
            }
            let words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
            let all_settings = words
                .iter()
                .filter_map(|w| w.strip_prefix("--"))
                .all(|f| facts::setting_by_flag(f.split('=').next().unwrap_or(f)).is_some());
            let has_value = words.len() > 1 || flag.contains('=');
            if all_settings && has_value && !words.iter().any(|w| facts::is_placeholder(w)) {
                values += 1;
                let words = words.iter().map(|w| w.trim_matches('\'').to_owned());
                if let Err(why) = spot_worker::settings::Source::defaults().with_args(words) {
                    problems.push(format!("{}: `{text}`: {why}", span.at()));
                }
            }
        }
        // Paths of the repository (`crates/...`, `scripts/...`), with a
        // test's name after `::` left out.
        if !text.contains(' ') {
            let path = text.split("::").next().unwrap_or(text);
            // `examples/primes` names the example's binary: its `.rs`.
            let binary = root.join(format!("{path}.rs")).exists();
            if let Some(problem) = super::missing_path(&root, path).filter(|_| !binary) {
                paths += 1;
                problems.push(format!(
                    "{}: `{text}`: {problem}: correct the path (was it moved?)",
                    span.at()
                ));
            } else if super::REPOSITORY_DIRS.iter().any(|d| path.starts_with(d)) {
                paths += 1;
            }
        }
        // `spot-worker` commands.
        if text.contains("spot-worker ") {
            for command in words::commands(text) {
                if let Some(args) = words::spot_worker_args(&command) {
                    commands += 1;
                    if let Err(why) = checker.check(&args) {
                        problems.push(format!("{}: `{text}`: {why}", span.at()));
                    }
                }
            }
        }
    }
    eprintln!(
        "prose: {variables} variables, {values} setting values, {flags} flags, {commands} \
         `spot-worker` commands and {paths} repository paths checked ({} flags of spot-worker \
         commands known)",
        facts.command_flags.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A default a sentence or a table states for a setting is the settings
/// table's: `` `KEY` (default 30 s) ``, `` (`KEY`, 2 s) ``,
/// `` `max_deliveries` (100) ``, or a table's "default" column.
#[test]
fn defaults_quoted_in_the_docs_are_the_tables() {
    let root = session::workspace_root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for span in prose_spans(&root) {
        // `KEY=value` is an example, not a default.
        if span.text.contains('=') {
            continue;
        }
        let Some(setting) = facts::setting_named(&span.text) else {
            continue;
        };
        let Some(stated) = prose::stated_default(&span.after) else {
            continue;
        };
        checked += 1;
        if !facts::is_default(setting, &stated) {
            problems.push(format!(
                "{}: `{}` is said to default to {stated}, but its default is {} \
                 (crates/settings/src/table.rs): correct the sentence, or the table",
                span.at(),
                span.text,
                setting.default_text()
            ));
        }
    }
    for page in blocks::pages(&root) {
        let relative = page.strip_prefix(&root).unwrap_or(&page).to_owned();
        let text = std::fs::read_to_string(&page).unwrap();
        for table in prose::Prose::of(&relative, &text).tables() {
            let Some(column) = table[0]
                .1
                .iter()
                .position(|h| h.eq_ignore_ascii_case("default"))
            else {
                continue;
            };
            for (line, row) in &table[1..] {
                let setting = row
                    .iter()
                    .filter_map(|cell| cell.split('`').nth(1))
                    .find_map(facts::setting_named);
                let (Some(setting), Some(stated)) = (setting, row.get(column)) else {
                    continue;
                };
                checked += 1;
                if !facts::is_default(setting, stated) && *stated != setting.default_text() {
                    problems.push(format!(
                        "{}:{line}: the default of {} is given as {stated}, but it is {} \
                         (crates/settings/src/table.rs)",
                        relative.display(),
                        setting.key(),
                        setting.default_text()
                    ));
                }
            }
        }
    }
    eprintln!(
        "defaults: {checked} stated in sentences and tables, each checked against the settings table"
    );
    assert!(
        checked > 0,
        "no default found: is the pattern still the docs'?"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README links the glossary before it first uses a word defined
/// there, each word the glossary must define is a heading of it, and every
/// link to one of its words lands on a heading.
#[test]
fn the_readme_links_the_glossary_before_using_its_words() {
    const REQUIRED: [&str; 6] = [
        "gate",
        "drain",
        "release floor",
        "attempt record",
        "completion marker",
        "job key",
    ];
    let root = session::workspace_root();
    let glossary = std::fs::read_to_string(root.join("docs/glossary.md")).unwrap();
    let terms: Vec<String> = glossary
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .map(|t| t.trim().to_lowercase())
        .collect();
    let mut problems = Vec::new();
    for word in REQUIRED {
        if !terms.iter().any(|t| t == word) {
            problems.push(format!("docs/glossary.md: no `### {word}` heading"));
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let readme_prose = prose::Prose::of(std::path::Path::new("README.md"), &readme).text;
    let lower = readme_prose.to_lowercase();
    let link = lower
        .find("](docs/glossary.md")
        .and_then(|at| lower[..at].rfind('['))
        .unwrap_or(usize::MAX);
    for term in &terms {
        if let Some(first) = first_word(&lower, term)
            && first < link
        {
            problems.push(format!(
                "README.md: \"{term}\" is used before the README links docs/glossary.md: \
                 link it there (`[{term}](docs/glossary.md#{})`)",
                term.replace(' ', "-")
            ));
        }
    }
    for page in blocks::pages(&root) {
        let text = std::fs::read_to_string(&page).unwrap();
        for (at, _) in text.match_indices("glossary.md#") {
            let anchor: String = text[at + "glossary.md#".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            if !terms.iter().any(|t| t.replace(' ', "-") == anchor) {
                problems.push(format!(
                    "{}: a link to glossary.md#{anchor}, which is no heading of the glossary",
                    page.display()
                ));
            }
        }
    }
    eprintln!(
        "glossary: {} words defined, the README links it before using any",
        terms.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The doc runner's counts are printed by these tests, never written into
/// docs/testing.md by hand, where they went stale.
#[test]
fn the_runners_counts_are_printed_not_written() {
    let root = session::workspace_root();
    let testing = std::fs::read_to_string(root.join("docs/testing.md")).unwrap();
    let start = testing
        .find("## Commands in the docs")
        .expect("docs/testing.md has \"Commands in the docs\"");
    let end = testing[start + 1..]
        .find("\n## ")
        .map_or(testing.len(), |at| start + 1 + at);
    let section = &testing[start..end];
    let words: Vec<&str> = section.split_whitespace().collect();
    let counted: Vec<String> = words
        .windows(2)
        .filter(|pair| {
            pair[0].chars().all(|c| c.is_ascii_digit())
                && ["blocks", "blocks,", "commands", "commands,", "`sh"].contains(&pair[1])
        })
        .map(|pair| pair.join(" "))
        .collect();
    assert!(
        counted.is_empty(),
        "docs/testing.md (\"Commands in the docs\") writes the doc runner's counts by hand \
         ({counted:?}): say instead that `cargo test -p spot-worker-cli --test it docs:: \
         -- --nocapture` prints them"
    );
}

/// The code spans of every page's prose.
fn prose_spans(root: &Path) -> Vec<prose::Span> {
    let mut spans = Vec::new();
    for page in blocks::pages(root) {
        let relative = page.strip_prefix(root).unwrap_or(&page).to_owned();
        let text = std::fs::read_to_string(&page).unwrap();
        spans.extend(prose::Prose::of(&relative, &text).spans());
    }
    spans
}

/// Where `term` first occurs in `text` as whole words.
fn first_word(text: &str, term: &str) -> Option<usize> {
    text.match_indices(term).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back();
        let after = text[at + term.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}
