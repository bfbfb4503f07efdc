//! The commands of a shell block, as words: enough of the shell's syntax
//! (quotes, `\` continuations, comments, `$(...)`, `|`, `;`, `&&`, `&`,
//! redirections) to find each `spot-worker` invocation and its arguments.
//! Synopses are read too: `[--flag N]`, `(A | --b)`, `ID...`.

/// The simple commands of `text`, each as its words.
pub fn commands(text: &str) -> Vec<Vec<String>> {
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let line = strip_comment(line);
        let mut pending = line.to_owned();
        // Command substitutions are commands of their own.
        while let Some(start) = pending.find("$(") {
            let Some(len) = pending[start + 2..].find(')') else {
                break;
            };
            let inner = pending[start + 2..start + 2 + len].to_owned();
            out.extend(split(&inner));
            pending.replace_range(start..start + 3 + len, "SUBSTITUTED");
        }
        out.extend(split(&pending));
    }
    out.retain(|words| !words.is_empty());
    out
}

/// `line` without its comment (a `#` at a word's start, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let mut previous = ' ';
    for (at, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return &line[..at],
            _ => {}
        }
        previous = c;
    }
    line
}

/// Splits one line into commands and words.
fn split(line: &str) -> Vec<Vec<String>> {
    let mut commands = vec![Vec::new()];
    let mut word = String::new();
    let mut in_word = false;
    let (mut single, mut double) = (false, false);
    // Brackets of a synopsis: a `|` inside them separates alternatives, not
    // commands.
    let mut depth = 0usize;
    let chars: Vec<char> = line.chars().collect();
    let mut i = 0;
    let end_word = |word: &mut String, in_word: &mut bool, commands: &mut Vec<Vec<String>>| {
        if *in_word {
            commands
                .last_mut()
                .expect("one command")
                .push(std::mem::take(word));
            *in_word = false;
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if single {
            if c == '\'' {
                single = false;
            } else {
                word.push(c);
            }
        } else if double {
            if c == '"' {
                double = false;
            } else {
                word.push(c);
            }
        } else {
            match c {
                '\'' => {
                    single = true;
                    in_word = true;
                }
                '"' => {
                    double = true;
                    in_word = true;
                }
                '[' | '(' => {
                    depth += 1;
                    end_word(&mut word, &mut in_word, &mut commands);
                }
                ']' | ')' => {
                    depth = depth.saturating_sub(1);
                    end_word(&mut word, &mut in_word, &mut commands);
                }
                '|' if depth > 0 => end_word(&mut word, &mut in_word, &mut commands),
                ';' | '&' | '|' => {
                    end_word(&mut word, &mut in_word, &mut commands);
                    // `2>&1` and `>&2` are redirections, not separators.
                    let redirect = c == '&' && i > 0 && chars[i - 1] == '>';
                    if !redirect {
                        commands.push(Vec::new());
                    }
                }
                c if c.is_whitespace() => end_word(&mut word, &mut in_word, &mut commands),
                _ => {
                    word.push(c);
                    in_word = true;
                }
            }
        }
        i += 1;
    }
    end_word(&mut word, &mut in_word, &mut commands);
    commands.into_iter().map(drop_redirections).collect()
}

/// The words without redirections (`< file`, `<<< text`, `2>&1`, `>out`).
fn drop_redirections(words: Vec<String>) -> Vec<String> {
    let mut kept = Vec::new();
    let mut skip_next = false;
    for word in words {
        if skip_next {
            skip_next = false;
            continue;
        }
        let redirection = word.trim_start_matches(|c: char| c.is_ascii_digit());
        if redirection.starts_with('<') || redirection.starts_with('>') {
            // A bare operator takes the next word as its target.
            skip_next = redirection.chars().all(|c| c == '<' || c == '>');
            continue;
        }
        kept.push(word);
    }
    kept
}

/// The arguments of a `spot-worker` invocation in `words`, if it is one:
/// `spot-worker ARGS` (any path to it, after `VAR=value` assignments and
/// `eval`/`exec`), or `cargo run ... -p spot-worker-cli -- ARGS`.
pub fn spot_worker_args(words: &[String]) -> Option<Vec<String>> {
    let start = words
        .iter()
        .position(|w| !is_assignment(w) && w != "eval" && w != "exec")?;
    let words = &words[start..];
    let first = words.first()?;
    if first == "spot-worker" || first.ends_with("/spot-worker") {
        return Some(words[1..].to_vec());
    }
    if first == "cargo" && words.get(1).is_some_and(|w| w == "run") {
        let cli = words
            .windows(2)
            .any(|pair| pair[0] == "-p" && pair[1] == "spot-worker-cli");
        let dashes = words.iter().position(|w| w == "--")?;
        return cli.then(|| words[dashes + 1..].to_vec());
    }
    None
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(list: &[&str]) -> Vec<String> {
        list.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn commands_are_split_as_the_shell_would() {
        let text = "X=1 spot-worker enqueue <<< '{\"a\": 1}'   # a comment\n\
                    spot-worker run --job-key id \\\n  -- python3 j.py &\n\
                    eval \"$(spot-worker dev env)\" && spot-worker status 2>&1 | head\n\
                    spot-worker poison purge (ID... | --reason-contains TEXT | --all) [--yes]\n";
        let all = commands(text);
        assert_eq!(
            all,
            vec![
                words(&["X=1", "spot-worker", "enqueue"]),
                words(&[
                    "spot-worker",
                    "run",
                    "--job-key",
                    "id",
                    "--",
                    "python3",
                    "j.py"
                ]),
                words(&["spot-worker", "dev", "env"]),
                words(&["eval", "SUBSTITUTED"]),
                words(&["spot-worker", "status"]),
                words(&["head"]),
                words(&[
                    "spot-worker",
                    "poison",
                    "purge",
                    "ID...",
                    "--reason-contains",
                    "TEXT",
                    "--all",
                    "--yes"
                ]),
            ]
        );
        assert_eq!(
            spot_worker_args(&all[0]),
            Some(words(&["enqueue"])),
            "after an assignment"
        );
        let cargo = words(&[
            "cargo",
            "run",
            "--release",
            "-p",
            "spot-worker-cli",
            "--",
            "demo",
        ]);
        assert_eq!(spot_worker_args(&cargo), Some(words(&["demo"])));
        assert_eq!(spot_worker_args(&words(&["cargo", "bench"])), None);
    }
}
