//! Finding the binaries a run starts: the `examples/primes` worker and the
//! `spot-worker` command of the profile this program was built with, rebuilt
//! when a source is newer.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};

/// The worker binary `examples/primes` of the profile this program was built
/// with, built first if it is missing or older than a source file (`cargo
/// test` builds it with the other targets; `cargo bench` does not).
pub fn worker_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("SPOT_WORKER_CHAOS_WORKER") {
        return Ok(PathBuf::from(path));
    }
    example_binary("primes")
}

/// The facade's example `examples/<name>` of the profile this program was
/// built with, built first if it is missing or older than a source file.
pub fn example_binary(name: &str) -> Result<PathBuf> {
    fresh_binary(&["examples", name], &["--example", name])
}

/// The `spot-worker` command (crates/cli) of the profile this program was
/// built with, built first if it is missing or stale: the facade's tests
/// that run it (the container image, the VM in a box's command path) do not
/// make cargo build another package's binaries.
pub fn cli_binary() -> Result<PathBuf> {
    fresh_binary(
        &["spot-worker"],
        &["-p", "spot-worker-cli", "--bin", "spot-worker"],
    )
}

/// The `spot-worker` command and the `examples/primes` worker as the
/// container image ships them: builds of the `image` profile (Cargo.toml:
/// fat LTO, for the image's size), statically linked, by
/// `scripts/build-static.sh` (cargo rebuilds only what changed). Their
/// paths.
pub fn static_binaries() -> Result<(PathBuf, PathBuf)> {
    let root = crate::workspace_root();
    let script = root.join("scripts/build-static.sh");
    eprintln!("building the static binaries: {}", script.display());
    let output = std::process::Command::new(&script)
        .current_dir(&root)
        .env("PROFILE", "image")
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed ({})", script.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let paths: Vec<PathBuf> = stdout.lines().map(|line| root.join(line)).collect();
    match paths.as_slice() {
        [cli, primes] if cli.exists() && primes.exists() => Ok((cli.clone(), primes.clone())),
        _ => bail!(
            "{} printed {stdout:?}, not the two binaries",
            script.display()
        ),
    }
}

/// `target/<profile>/<path>`, built with `cargo build <args>` when missing or
/// older than a source file.
fn fresh_binary(path: &[&str], args: &[&str]) -> Result<PathBuf> {
    // This program is target/<profile>/deps/<name>-<hash>.
    let exe = std::env::current_exe().context("locating this program")?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .context("this program is not in target/<profile>/deps")?;
    let binary = path
        .iter()
        .fold(profile_dir.to_path_buf(), |p, s| p.join(s));
    let root = crate::workspace_root();
    let workspace = root.as_path();
    if is_fresh(&binary, workspace) {
        return Ok(binary);
    }
    let release = profile_dir
        .file_name()
        .is_some_and(|name| name == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build.current_dir(workspace).arg("build").args(args);
    if release {
        build.arg("--release");
    }
    eprintln!("building {}: {build:?}", binary.display());
    let status = build.status().context("running cargo build")?;
    if !status.success() || !binary.exists() {
        bail!("building {} failed ({status})", binary.display());
    }
    Ok(binary)
}

/// True if `binary` exists and is newer than every Rust source and manifest
/// it could be built from.
fn is_fresh(binary: &Path, workspace: &Path) -> bool {
    fn newest(dir: &Path, newest_seen: &mut SystemTime) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name == "target" || name.starts_with('.') || name == "node_modules" {
                continue;
            }
            if path.is_dir() {
                newest(&path, newest_seen);
            } else if (name.ends_with(".rs") || name == "Cargo.toml" || name == "Cargo.lock")
                && let Ok(modified) = entry.metadata().and_then(|m| m.modified())
            {
                *newest_seen = (*newest_seen).max(modified);
            }
        }
    }
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else {
        return false;
    };
    let mut newest_source = SystemTime::UNIX_EPOCH;
    for dir in ["crates", "src", "examples"] {
        newest(&workspace.join(dir), &mut newest_source);
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        if let Ok(modified) = std::fs::metadata(workspace.join(file)).and_then(|m| m.modified()) {
            newest_source = newest_source.max(modified);
        }
    }
    built >= newest_source
}
