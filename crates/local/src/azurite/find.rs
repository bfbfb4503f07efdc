//! Which `azurite` to run: the one `AZURITE_BIN` names, else a clone's
//! pinned one (`tools/azurite/node_modules/.bin/azurite` here or in a
//! parent directory), else the one on `PATH`. Looked up at run time, so the
//! binary holds no path of the machine it was built on.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::HarnessError;

/// Where a clone of spot-worker keeps its pinned Azurite.
const IN_A_CLONE: &str = "tools/azurite/node_modules/.bin/azurite";

/// The `azurite` to run, or an error that says where it was looked for and
/// how to install it.
pub fn find_azurite() -> Result<PathBuf, HarnessError> {
    let cwd = std::env::current_dir().unwrap_or_default();
    choose(
        std::env::var_os("AZURITE_BIN").as_deref(),
        &cwd,
        std::env::var_os("PATH").as_deref(),
    )
}

/// [`find_azurite`] on given inputs (a pure lookup, for tests).
fn choose(
    configured: Option<&OsStr>,
    cwd: &Path,
    path: Option<&OsStr>,
) -> Result<PathBuf, HarnessError> {
    if let Some(configured) = configured.filter(|c| !c.is_empty()) {
        let binary = PathBuf::from(configured);
        return if binary.is_file() {
            Ok(binary)
        } else {
            Err(HarnessError::NotInstalled(format!(
                "AZURITE_BIN names {}, which does not exist; {}",
                binary.display(),
                HOW_TO_INSTALL
            )))
        };
    }
    let in_clone = cwd
        .ancestors()
        .map(|dir| dir.join(IN_A_CLONE))
        .find(|candidate| candidate.is_file());
    let on_path = || {
        path.into_iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join("azurite"))
            .find(|candidate| candidate.is_file())
    };
    in_clone.or_else(on_path).ok_or_else(|| {
        HarnessError::NotInstalled(format!(
            "azurite not found (not on PATH, and no {IN_A_CLONE} in {} or above); {HOW_TO_INSTALL}",
            cwd.display()
        ))
    })
}

/// What to do about a missing Azurite.
const HOW_TO_INSTALL: &str = "install Azurite with `npm install -g azurite` (Node.js 22 or \
    later), or in a clone of spot-worker with `npm ci --prefix tools/azurite`; or run it in a \
    container (`docker run -d -p 10000-10002:10000-10002 mcr.microsoft.com/azure-storage/azurite`) \
    and `spot-worker dev` uses it; or set AZURITE_BIN to its path";

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }

    #[test]
    fn the_configured_binary_wins_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let configured = dir.path().join("my-azurite");
        touch(&configured);
        touch(&dir.path().join(IN_A_CLONE));
        let chosen = choose(Some(configured.as_os_str()), dir.path(), None).unwrap();
        assert_eq!(chosen, configured);

        let missing = dir.path().join("nowhere");
        let error = choose(Some(missing.as_os_str()), dir.path(), None)
            .unwrap_err()
            .to_string();
        assert!(error.contains("AZURITE_BIN names"), "{error}");
        assert!(error.contains("npm install -g azurite"), "{error}");
    }

    #[test]
    fn a_clone_above_the_current_directory_comes_before_path() {
        let clone = tempfile::tempdir().unwrap();
        touch(&clone.path().join(IN_A_CLONE));
        let deep = clone.path().join("crates/cli");
        std::fs::create_dir_all(&deep).unwrap();
        let bin = tempfile::tempdir().unwrap();
        touch(&bin.path().join("azurite"));
        let chosen = choose(None, &deep, Some(bin.path().as_os_str())).unwrap();
        assert_eq!(chosen, clone.path().join(IN_A_CLONE));
        // Outside a clone: the one on PATH.
        let elsewhere = tempfile::tempdir().unwrap();
        let chosen = choose(None, elsewhere.path(), Some(bin.path().as_os_str())).unwrap();
        assert_eq!(chosen, bin.path().join("azurite"));
    }

    #[test]
    fn nothing_found_says_what_to_install() {
        let elsewhere = tempfile::tempdir().unwrap();
        let error = choose(None, elsewhere.path(), Some(OsStr::new("")))
            .unwrap_err()
            .to_string();
        for hint in [
            "npm install -g azurite",
            "npm ci --prefix tools/azurite",
            "mcr.microsoft.com/azure-storage/azurite",
            "AZURITE_BIN",
        ] {
            assert!(error.contains(hint), "{hint}: {error}");
        }
    }
}
