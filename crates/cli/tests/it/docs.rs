//! The doc runner: every command shown in README.md and docs/*.md either
//! runs here (```` ```sh ```` blocks, page by page, against Azurite and the
//! IMDS emulator; a ```` ```text ```` block right after one is its expected
//! output) or is tagged as not run (```` ```sh azure ````, ```` ```sh no-ci
//! ````), and then at least every `spot-worker` subcommand and flag in it
//! must exist, and every path of the repository it names. Output shown
//! without being run is tagged ```` ```text abridged ````. The prose is
//! held to the code too: every variable, setting value and default, flag
//! and `spot-worker` command it quotes. The tags are described in
//! docs/testing.md ("Commands in the docs"); each test prints its counts
//! (`-- --nocapture`).

pub(crate) mod blocks;
mod claims;
mod facts;
mod help;
mod inventory;
mod links;
mod prose;
pub(crate) mod session;
mod words;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use blocks::{Block, Kind};

const SPOT_WORKER: &str = env!("CARGO_BIN_EXE_spot-worker");

/// Top-level directories whose paths, when a command names them, must
/// exist.
pub const REPOSITORY_DIRS: [&str; 8] = [
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
    let mut blocks_by_tag: BTreeMap<&str, usize> = BTreeMap::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut invocations = 0;
    for block in all.iter().filter(|b| b.kind.is_shell()) {
        let tag = match block.kind {
            Kind::Run => "sh",
            Kind::Azure => "sh azure",
            _ => "sh no-ci",
        };
        *blocks_by_tag.entry(tag).or_default() += 1;
        let commands = words::commands(&block.text);
        *counts.entry(tag).or_default() += commands.len();
        for command in &commands {
            if let Some(args) = words::spot_worker_args(command) {
                invocations += 1;
                if let Err(why) = checker.check(&args) {
                    problems.push(format!("{}: {why}: {}", block.at(), command.join(" ")));
                }
            }
            for word in command {
                if let Some(problem) = missing_path(&root, word) {
                    problems.push(format!("{}: {problem}", block.at()));
                }
            }
        }
    }
    let pages = blocks::pages(&root).len();
    eprintln!(
        "doc runner: {pages} pages; shell blocks by tag {blocks_by_tag:?}, their commands \
         {counts:?} (each side of a pipe or && counts); {invocations} `spot-worker` \
         invocations checked against the binary"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A `text` block is output: compared with what the `sh` block before it
/// printed, or tagged `text abridged` (shown, not run) so that no sample
/// claims to be what a command prints without being checked.
#[test]
fn every_text_block_is_compared_or_marked_abridged() {
    let root = session::workspace_root();
    let all = blocks::all(&root);
    let mut problems = Vec::new();
    let (mut compared, mut abridged) = (0, 0);
    for (index, block) in all.iter().enumerate() {
        match block.kind {
            Kind::Output => {
                let previous = index.checked_sub(1).map(|i| &all[i]);
                match previous {
                    Some(p) if p.kind == Kind::Run && p.file == block.file => compared += 1,
                    _ => problems.push(format!(
                        "{}: a `text` block not right after an `sh` block is never compared: \
                         show the command in an `sh` block before it (then its output is \
                         checked), tag it `text abridged` if it is output shown but not run \
                         (and say in the sentence before what it leaves out or where it comes \
                         from), or tag it with what it is (`ini`, `json`, `formula`)",
                        block.at()
                    )),
                }
            }
            Kind::Abridged => abridged += 1,
            _ => {}
        }
    }
    eprintln!(
        "text blocks: {compared} compared with the output of the sh block before, {abridged} marked abridged"
    );
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
    let (mut ran, mut compared) = (0, 0);
    let mut ran_pages = Vec::new();
    for (page, blocks) in &pages {
        if !blocks.iter().any(|b| b.kind == Kind::Run) {
            continue;
        }
        ran_pages.push(page.display().to_string());
        eprintln!("running the sh blocks of {}", page.display());
        let run = session::run_page(&root, Path::new(SPOT_WORKER), blocks);
        // A text block right after an sh block shows its output.
        let mut n = 0;
        for pair in blocks.windows(2) {
            if pair[0].kind != Kind::Run {
                continue;
            }
            if pair[1].kind == Kind::Output {
                compared += 1;
                if let Err(why) = session::check_output(&pair[1].text, &run.outputs[n]) {
                    panic!(
                        "{}: the output shown at {}: {why}",
                        pair[0].at(),
                        pair[1].at()
                    );
                }
            }
            n += 1;
        }
        ran += blocks.iter().filter(|b| b.kind == Kind::Run).count();
    }
    eprintln!(
        "ran {ran} sh blocks of {} pages ({}), {compared} of them with their output compared",
        ran_pages.len(),
        ran_pages.join(", ")
    );
    assert!(ran > 0, "no sh block ran");
}
