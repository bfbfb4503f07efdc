//! The relative links of the docs: every `[text](target)` of a page's prose
//! that is not a web address names a file of the repository, and its
//! `#anchor`, if any, one of the headings of the Markdown page it names, as
//! GitHub makes anchors of headings.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use super::prose::Prose;

/// One link of a page's prose.
#[derive(Debug, PartialEq)]
pub struct Link {
    /// 1-based line of the link.
    pub line: usize,
    /// What is between the parentheses, without a title.
    pub target: String,
}

/// The links of a page's prose (fenced blocks and code spans left out).
pub fn links(prose: &Prose) -> Vec<Link> {
    let text = without_code_spans(&prose.text);
    let mut links = Vec::new();
    for (at, _) in text.match_indices("](") {
        let rest = &text[at + 2..];
        let Some(end) = rest.find(')') else {
            continue;
        };
        let target = rest[..end].split_whitespace().next().unwrap_or_default();
        let target = target.trim_start_matches('<').trim_end_matches('>');
        links.push(Link {
            line: prose.line_of(at),
            target: target.to_owned(),
        });
    }
    links
}

/// Whether a link leaves the repository (a web address, mail).
pub fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// `text` with the inside of every code span blanked (a link shown as code
/// is not a link), its length and line breaks kept.
fn without_code_spans(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = text.as_bytes().to_vec();
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] != b'`' {
            at += 1;
            continue;
        }
        let run = bytes[at..].iter().take_while(|&&b| b == b'`').count();
        let start = at + run;
        let closing = "`".repeat(run);
        let paragraph_end = text[start..].find("\n\n").map_or(text.len(), |e| start + e);
        let Some(end) = text[start..paragraph_end]
            .match_indices(&closing)
            .map(|(e, _)| start + e)
            .find(|&e| bytes.get(e + run) != Some(&b'`') && bytes[e - 1] != b'`')
        else {
            at = start;
            continue;
        };
        for byte in &mut out[start..end] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        at = end + run;
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

/// The anchors GitHub gives the headings of a Markdown page: each heading's
/// slug ([`slug`]), a repeated one followed by `-1`, `-2`, ...
pub fn anchors(markdown: &str) -> BTreeSet<String> {
    let prose = Prose::of(Path::new(""), markdown);
    let mut anchors = BTreeSet::new();
    for line in prose.text.lines() {
        let trimmed = line.trim_start();
        if line.len() - trimmed.len() > 3 {
            continue;
        }
        let hashes = trimmed.len() - trimmed.trim_start_matches('#').len();
        if !(1..=6).contains(&hashes) || !trimmed[hashes..].starts_with(' ') {
            continue;
        }
        let title = trimmed[hashes..].trim().trim_end_matches('#').trim_end();
        let base = slug(title);
        let mut anchor = base.clone();
        let mut n = 0;
        while anchors.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        anchors.insert(anchor);
    }
    anchors
}

/// GitHub's anchor of a heading: its text (a link's text for the link,
/// formatting marks dropped) in lower case, every character that is not a
/// letter, a digit, a space, `-` or `_` left out, and each space made `-`.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // `[text](target)` reads as its text.
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// What is wrong with a relative link of `page` (relative to `root`), if
/// anything: a file that does not exist, or an anchor that is no heading of
/// the page it names.
pub fn problem(root: &Path, page: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        page.to_owned()
    } else {
        normalise(&page.parent().unwrap_or(Path::new("")).join(path))?
    };
    let absolute = root.join(&file);
    if !absolute.exists() {
        return Some(format!("{} does not exist", file.display()));
    }
    let anchor = anchor?;
    if absolute.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let markdown = std::fs::read_to_string(&absolute).ok()?;
    let anchors = anchors(&markdown);
    (!anchors.contains(anchor)).then(|| {
        let near: Vec<&String> = anchors
            .iter()
            .filter(|a| a.split('-').any(|w| w.len() > 3 && anchor.contains(w)))
            .take(5)
            .collect();
        format!(
            "#{anchor} is no heading of {} (GitHub's anchors of headings; near: {near:?})",
            file.display()
        )
    })
}

/// `a/../b` as `b`; `None` for a path that leaves the repository.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_become_githubs_anchors() {
        let rows = [
            (
                "The patient policy (the default)",
                "the-patient-policy-the-default",
            ),
            (
                "Deadlines: the lane rule on real Spot traces",
                "deadlines-the-lane-rule-on-real-spot-traces",
            ),
            (
                "Did autoscale read the queue? Check after a deploy",
                "did-autoscale-read-the-queue-check-after-a-deploy",
            ),
            (
                "`spot-worker run`, a program as the job",
                "spot-worker-run-a-program-as-the-job",
            ),
            (
                "Pod-in-a-box: a node's preempt and a scale-in",
                "pod-in-a-box-a-nodes-preempt-and-a-scale-in",
            ),
            (
                "[Lanes](deploying.md) and `SPOT_WORKER_LANE`",
                "lanes-and-spot_worker_lane",
            ),
            (
                "Deploying to Azure (Spot VM scale set)",
                "deploying-to-azure-spot-vm-scale-set",
            ),
        ];
        for (heading, anchor) in rows {
            assert_eq!(slug(heading), anchor, "{heading}");
        }
        let page = "# A\n\n```sh\n# not a heading\n```\n## A\n### B ##\n";
        let anchors: Vec<String> = anchors(page).into_iter().collect();
        assert_eq!(anchors, ["a", "a-1", "b"]);
    }

    #[test]
    fn links_in_code_are_not_links() {
        let page = "See [a](a.md#x), `[b](b.md)` and ``[c](c.md)``,\n[d](<d.md> \"title\").\n";
        let prose = Prose::of(Path::new("p.md"), page);
        let targets: Vec<(usize, String)> = links(&prose)
            .into_iter()
            .map(|l| (l.line, l.target))
            .collect();
        assert_eq!(targets, [(1, "a.md#x".to_owned()), (2, "d.md".to_owned())]);
        assert!(is_external("https://example.com") && !is_external("docs/a.md"));
        assert_eq!(
            normalise(Path::new("docs/../README.md")),
            Some(PathBuf::from("README.md"))
        );
        assert_eq!(normalise(Path::new("../x")), None);
    }
}
