//! The configuration table of `docs/configuration.md` is the settings
//! table, row for row. `SPOT_WORKER_BLESS=1 cargo test -p
//! spot-worker-settings --test readme` rewrites it after a change to the
//! table.

use std::path::Path;

const HEADER: &str = "| variable | default | meaning |";

#[test]
fn the_docs_list_exactly_the_settings_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = readme
        .find(HEADER)
        .expect("docs/configuration.md has the configuration table");
    let end = readme[start..]
        .find("\n\n")
        .map_or(readme.len(), |at| start + at + 1);
    let expected = spot_worker_settings::markdown_table();
    if readme[start..end] == expected {
        return;
    }
    if std::env::var("SPOT_WORKER_BLESS").as_deref() == Ok("1") {
        let blessed = format!("{}{expected}{}", &readme[..start], &readme[end..]);
        std::fs::write(&path, blessed).unwrap();
        return;
    }
    panic!(
        "docs/configuration.md's configuration table differs from the settings table; \
         run with SPOT_WORKER_BLESS=1 to rewrite it. Expected:\n{expected}"
    );
}
