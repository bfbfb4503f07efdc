//! Throwaway certificate authorities and server certificates, made with
//! openssl(1) for the test only: one CA the VM trusts (it goes into the
//! box's CA bundle) and one it does not.

use std::path::{Path, PathBuf};

use super::run;

/// A certificate authority: its certificate and key.
pub struct Ca {
    pub cert: PathBuf,
    key: PathBuf,
}

/// A server certificate and its key.
pub struct ServerCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A new CA called `name` in `dir`.
pub fn new_ca(dir: &Path, name: &str) -> Ca {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    run(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            path(&key),
            "-out",
            path(&cert),
        ],
    );
    Ca { cert, key }
}

impl Ca {
    /// A server certificate for `dns_names` (wildcards allowed; an IP
    /// address becomes an IP name, as the API server's ClusterIP is),
    /// signed by this CA, in `dir` as `<file_name>.crt` / `.key`.
    pub fn issue(&self, dir: &Path, file_name: &str, dns_names: &[&str]) -> ServerCert {
        let cert = dir.join(format!("{file_name}.crt"));
        let key = dir.join(format!("{file_name}.key"));
        let csr = dir.join(format!("{file_name}.csr"));
        let ext = dir.join(format!("{file_name}.ext"));
        let names: Vec<String> = dns_names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(_) => format!("IP:{n}"),
                Err(_) => format!("DNS:{n}"),
            })
            .collect();
        std::fs::write(
            &ext,
            format!(
                "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
                 extendedKeyUsage=serverAuth\nsubjectAltName={}\n",
                names.join(",")
            ),
        )
        .unwrap();
        run(
            "openssl",
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN={}", dns_names[0]),
                "-keyout",
                path(&key),
                "-out",
                path(&csr),
            ],
        );
        run(
            "openssl",
            &[
                "x509",
                "-req",
                "-in",
                path(&csr),
                "-CA",
                path(&self.cert),
                "-CAkey",
                path(&self.key),
                "-CAcreateserial",
                "-days",
                "2",
                "-sha256",
                "-extfile",
                path(&ext),
                "-out",
                path(&cert),
            ],
        );
        ServerCert { cert, key }
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}
