//! The doc runner: every command shown in README.md and docs/*.md either
//! runs here (```` ```sh ```` blocks, page by page, against Azurite and the
//! IMDS emulator; a ```` ```text ```` block right after one is its expected
//! output) or is tagged as not run (```` ```sh azure ````, ```` ```sh no-ci
//! ````), and then at least every `spot-worker` subcommand and flag in it
//! must exist, and every path of the repository it names. The tags are
//! described in docs/testing.md ("Commands in the docs").

#[path = "docs/blocks.rs"]
mod blocks;
#[path = "docs/help.rs"]
mod help;
#[path = "docs/session.rs"]
mod session;
#[path = "docs/words.rs"]
mod words;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use blocks::{Block, Kind};

const SPOT_WORKER: &str = env!("CARGO_BIN_EXE_spot-worker");

/// Top-level directories whose paths, when a command names them, must
/// exist.
const REPOSITORY_DIRS: [&str; 8] = [
    "scripts/",
    "examples/",
    "crates/",
    "tools/",
    "bicep/",
    "deploy/",
    "container/",
    "benches/",
];

#[test]
fn every_block_is_tagged_and_every_command_exists() {
    let root = session::workspace_root();
    let all = blocks::all(&root);
    let mut checker = help::Checker::new(SPOT_WORKER);
    let mut problems = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for block in all.iter().filter(|b| b.kind.is_shell()) {
        let commands = words::commands(&block.text);
        *counts
            .entry(match block.kind {
                Kind::Run => "run",
                Kind::Azure => "azure",
                _ => "no-ci",
            })
            .or_default() += commands.len();
        for command in &commands {
            if let Some(args) = words::spot_worker_args(command)
                && let Err(why) = checker.check(&args)
            {
                problems.push(format!("{}: {why}: {}", block.at(), command.join(" ")));
            }
            for word in command {
                if let Some(problem) = missing_path(&root, word) {
                    problems.push(format!("{}: {problem}", block.at()));
                }
            }
        }
    }
    eprintln!("commands in the docs' shell blocks, by tag: {counts:?}");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A repository path a command names that does not exist.
fn missing_path(root: &Path, word: &str) -> Option<String> {
    let word = word.trim_end_matches([',', '.', ':']);
    let dir = REPOSITORY_DIRS.iter().find(|d| word.starts_with(*d))?;
    if word.contains(['*', '<', '$', '{']) || word.len() == dir.len() {
        return None;
    }
    (!root.join(word).exists()).then(|| format!("{word} does not exist"))
}

#[test]
fn the_sh_blocks_run_and_print_what_the_docs_show() {
    let root = session::workspace_root();
    let all = blocks::all(&root);
    let mut pages: BTreeMap<PathBuf, Vec<Block>> = BTreeMap::new();
    for block in all {
        pages.entry(block.file.clone()).or_default().push(block);
    }
    let mut ran = 0;
    for (page, blocks) in &pages {
        if !blocks.iter().any(|b| b.kind == Kind::Run) {
            continue;
        }
        eprintln!("running the sh blocks of {}", page.display());
        let run = session::run_page(&root, Path::new(SPOT_WORKER), blocks);
        // A text block right after an sh block shows its output.
        let mut n = 0;
        for pair in blocks.windows(2) {
            if pair[0].kind != Kind::Run {
                continue;
            }
            if pair[1].kind == Kind::Output
                && let Err(why) = session::check_output(&pair[1].text, &run.outputs[n])
            {
                panic!(
                    "{}: the output shown at {}: {why}",
                    pair[0].at(),
                    pair[1].at()
                );
            }
            n += 1;
        }
        ran += blocks.iter().filter(|b| b.kind == Kind::Run).count();
    }
    eprintln!("ran {ran} sh blocks");
    assert!(ran > 0, "no sh block ran");
}
