//! The VM's view of the world inside the box: loopback up, IMDS's
//! link-local address on it, `/etc/hosts` naming the storage account's
//! production host names, and the system CA bundle with the test CA added
//! (the way an image with a corporate CA would have it). Both files are
//! replaced by bind mounts in the box's private mount namespace only, so
//! the worker's environment needs nothing special: no `SSL_CERT_FILE`, no
//! endpoint overrides.

use std::path::{Path, PathBuf};

use super::run;

/// IMDS's fixed address.
pub const IMDS_IP: &str = "169.254.169.254";
/// The system CA bundle (Debian/Ubuntu), which curl and the worker's TLS
/// stack read.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Brings loopback up and gives it IMDS's address.
pub fn bring_up() {
    run("ip", &["link", "set", "lo", "up"]);
    run(
        "ip",
        &["addr", "add", &format!("{IMDS_IP}/32"), "dev", "lo"],
    );
}

/// The box's `/etc/hosts`, rewritable while mounted (same file, new
/// content: the resolver reads it on every lookup).
pub struct Hosts {
    file: PathBuf,
}

impl Hosts {
    /// Mounts a hosts file from `dir` over `/etc/hosts`, with `entries`.
    pub fn mount(dir: &Path, entries: &[(&str, &str)]) -> Hosts {
        let hosts = Hosts {
            file: dir.join("hosts"),
        };
        hosts.set(entries);
        run("mount", &["--bind", path(&hosts.file), "/etc/hosts"]);
        hosts
    }

    /// Replaces the entries (`(address, name)`), keeping localhost.
    pub fn set(&self, entries: &[(&str, &str)]) {
        let mut text = "127.0.0.1 localhost\n::1 localhost\n".to_owned();
        for (address, name) in entries {
            text.push_str(&format!("{address} {name}\n"));
        }
        std::fs::write(&self.file, text).expect("writing the box's hosts file");
    }
}

/// Mounts the system CA bundle plus `ca_cert` over the system bundle.
pub fn trust(dir: &Path, ca_cert: &Path) {
    let mut bundle = std::fs::read_to_string(CA_BUNDLE)
        .unwrap_or_else(|e| panic!("the system CA bundle {CA_BUNDLE} is needed: {e}"));
    bundle.push('\n');
    bundle.push_str(&std::fs::read_to_string(ca_cert).unwrap());
    let file = dir.join("ca-certificates.crt");
    std::fs::write(&file, bundle).unwrap();
    run("mount", &["--bind", path(&file), CA_BUNDLE]);
}

/// The rendezvous of the workers on one VM (`SPOT_WORKER_RUNTIME_DIR`'s
/// default); a directory of the box's own is mounted over it, as each VM
/// has its own `/run`: boxes running at once (the tests of one binary run
/// in parallel) would otherwise share the host's and, all watching IMDS at
/// the same address, wait for each other's workers before approving.
pub const RUNTIME_DIR: &str = "/run/spot-worker";

/// Mounts a fresh directory from `dir` over [`RUNTIME_DIR`] (made on the
/// host first if missing: an empty mount point). Without the right to make
/// it (not root), the box goes without, and says so.
pub fn own_runtime_dir(dir: &Path) {
    if let Err(e) = std::fs::create_dir_all(RUNTIME_DIR) {
        super::the_box::note(format!(
            "box: no {RUNTIME_DIR} of its own ({e}); its workers approve events only at their deadline"
        ));
        return;
    }
    let own = dir.join("run-spot-worker");
    std::fs::create_dir_all(&own).unwrap();
    run("mount", &["--bind", path(&own), RUNTIME_DIR]);
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}
