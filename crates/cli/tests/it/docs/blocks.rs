//! The fenced code blocks of README.md and docs/*.md, and what their tags
//! mean (docs/testing.md, "Commands in the docs").

use std::path::{Path, PathBuf};

/// What a block is, from its info string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// ```` ```sh ````: runs locally, in CI.
    Run,
    /// ```` ```sh azure ````: needs an Azure subscription or cluster.
    Azure,
    /// ```` ```sh no-ci ````: shown and checked, not run (the test command
    /// itself, runs of many minutes, a second terminal, synopses).
    NoCi,
    /// ```` ```text ````: output, compared with what the `sh` block before
    /// it printed; a `text` block anywhere else is an error.
    Output,
    /// ```` ```text abridged ````: output shown but not compared (abridged,
    /// edited, or from a run the runner cannot make); the prose says so.
    Abridged,
    /// ```` ```LANG FILE ````: a file the page's commands use, written
    /// before they run.
    File(String),
    /// Any other language (Rust blocks are doc tests).
    Other,
}

impl Kind {
    /// A shell block, run or not: its `spot-worker` commands are checked.
    pub fn is_shell(&self) -> bool {
        matches!(self, Kind::Run | Kind::Azure | Kind::NoCi)
    }
}

#[derive(Debug, Clone)]
pub struct Block {
    pub file: PathBuf,
    /// 1-based line of the opening fence.
    pub line: usize,
    pub kind: Kind,
    pub text: String,
}

impl Block {
    pub fn at(&self) -> String {
        format!("{}:{}", self.file.display(), self.line)
    }
}

/// The kind of an info string, or why it is not one of the convention's.
pub fn kind(info: &str) -> Result<Kind, String> {
    let words: Vec<&str> = info.split_whitespace().collect();
    match words.as_slice() {
        [] => Err(
            "a fenced block without a tag: tag it `sh` (runs in CI), `sh azure`, \
                   `sh no-ci`, `text` or its language"
                .to_owned(),
        ),
        ["sh"] => Ok(Kind::Run),
        ["sh", "azure"] => Ok(Kind::Azure),
        ["sh", "no-ci"] => Ok(Kind::NoCi),
        ["sh", ..] => Err(format!(
            "unknown shell block tag {info:?}: `sh`, `sh azure` or `sh no-ci`"
        )),
        ["text"] => Ok(Kind::Output),
        ["text", "abridged"] => Ok(Kind::Abridged),
        ["text", ..] => Err(format!(
            "unknown text block tag {info:?}: `text` (compared with the `sh` block's \
             output) or `text abridged` (shown, not compared)"
        )),
        [_, file] => Ok(Kind::File((*file).to_owned())),
        [_] => Ok(Kind::Other),
        _ => Err(format!("unknown block tag {info:?}")),
    }
}

/// The blocks of one Markdown text (fences may be indented, inside lists).
pub fn parse(file: &Path, markdown: &str) -> Result<Vec<Block>, String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, usize, String, Kind, Vec<String>)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let fence = trimmed.starts_with("```");
        match &mut open {
            None if fence => {
                let info = trimmed.trim_start_matches('`');
                let kind =
                    kind(info).map_err(|e| format!("{}:{}: {e}", file.display(), index + 1))?;
                open = Some((index + 1, indent, "```".to_owned(), kind, Vec::new()));
            }
            None => {}
            Some((start, fence_indent, _, kind, lines)) => {
                if fence && trimmed.trim_start_matches('`').trim().is_empty() {
                    blocks.push(Block {
                        file: file.to_owned(),
                        line: *start,
                        kind: kind.clone(),
                        text: lines.join("\n") + "\n",
                    });
                    open = None;
                } else {
                    let cut = (*fence_indent).min(indent);
                    lines.push(line.get(cut..).unwrap_or_default().to_owned());
                }
            }
        }
    }
    match open {
        Some((start, ..)) => Err(format!(
            "{}:{start}: a block that never ends",
            file.display()
        )),
        None => Ok(blocks),
    }
}

/// README.md and docs/*.md of the workspace at `root`, in name order.
pub fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// Every block of every page.
pub fn all(root: &Path) -> Vec<Block> {
    let mut all = Vec::new();
    for page in pages(root) {
        let text = std::fs::read_to_string(&page).expect("page is readable");
        let relative = page.strip_prefix(root).unwrap_or(&page).to_owned();
        all.extend(parse(&relative, &text).unwrap_or_else(|e| panic!("{e}")));
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_follow_the_convention() {
        let table = [
            ("sh", Ok(Kind::Run)),
            ("sh azure", Ok(Kind::Azure)),
            ("sh no-ci", Ok(Kind::NoCi)),
            ("text", Ok(Kind::Output)),
            ("text abridged", Ok(Kind::Abridged)),
            ("python job.py", Ok(Kind::File("job.py".to_owned()))),
            ("rust,no_run", Ok(Kind::Other)),
        ];
        for (info, expected) in table {
            assert_eq!(kind(info), expected, "{info}");
        }
        assert!(kind("").is_err());
        assert!(kind("sh azur").is_err());
        assert!(kind("text abridge").is_err());
    }

    #[test]
    fn indented_blocks_are_read_whole() {
        let markdown =
            "intro\n\n- item\n\n  ```sh\n  one \\\n    two\n  ```\n\n```text\nout\n```\n";
        let blocks = parse(Path::new("x.md"), markdown).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].line, 5);
        assert_eq!(blocks[0].text, "one \\\n  two\n");
        assert_eq!(blocks[1].kind, Kind::Output);
        assert!(parse(Path::new("x.md"), "```\nx\n```\n").is_err());
        assert!(parse(Path::new("x.md"), "```sh\nx\n").is_err());
    }
}
