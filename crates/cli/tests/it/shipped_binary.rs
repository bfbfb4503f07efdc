//! The shipped `spot-worker` binary holds no test code: the test kit is a
//! dev-dependency only (what `dev` and `demo --azurite` need lives in
//! `spot-worker-local`), and no path of the build machine is compiled in
//! to find Azurite with.

use std::path::Path;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[test]
fn the_binary_holds_no_test_kit_and_no_build_paths() {
    let binary = std::fs::read(env!("CARGO_BIN_EXE_spot-worker")).expect("the binary is readable");
    // The local crate is in (its advice on installing Azurite), so what
    // `dev` needs came from there.
    assert!(
        contains(&binary, b"npm install -g azurite"),
        "spot-worker-local is linked"
    );
    for needle in [
        "crates/testkit",
        "spot_worker_testkit",
        "spot-worker-testkit",
    ] {
        assert!(
            !contains(&binary, needle.as_bytes()),
            "{needle} is in the binary"
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the workspace root");
    let azurite = root.join("tools/azurite");
    assert!(
        !contains(&binary, azurite.to_string_lossy().as_bytes()),
        "{} is in the binary",
        azurite.display()
    );
}

#[test]
fn the_cli_depends_on_the_test_kit_only_for_its_tests() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .expect("Cargo.toml is readable");
    let (dependencies, dev) = manifest
        .split_once("[dev-dependencies]")
        .expect("a [dev-dependencies] table");
    assert!(
        !dependencies.contains("spot-worker-testkit"),
        "{dependencies}"
    );
    assert!(dev.contains("spot-worker-testkit"));
}
