//! The VM's files as `bicep/modules/compute.bicep` renders them: its
//! `var x = replace(...)` chain is evaluated literally (`loadTextContent`,
//! `replace`, `base64`, vars and parameters), the cloud-init document's
//! `write_files` are decoded, and the systemd unit, the environment file and
//! the install script are returned as the VM would have them. Shared by
//! `tests/it/deploy.rs`, `tests/it/storage_permissions.rs` and the boxes; with
//! the sample values `main.bicep` would pass ([`sample_deployment_values`])
//! and the one swap that runs the rendered worker against Azurite
//! ([`swapped_for_azurite`]).

#![allow(dead_code)] // Each test binary uses its own subset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use spot_worker_imds_emulator::{Emulator, EmulatorConfig, RunningEmulator};
use spot_worker_testkit::Azurite;

mod scale_in;
use scale_in::scale_in_switch;

/// Where cloud-init puts the files the unit refers to.
pub const ENV_FILE: &str = "/etc/spot-worker/worker.env";
pub const UNIT_FILE: &str = "/etc/systemd/system/spot-worker.service";
pub const INSTALL_SCRIPT: &str = "/usr/local/lib/spot-worker/install-worker.sh";

/// What `main.bicep` passes to `modules/compute.bicep`, with a sample
/// account and identity (swapped for Azurite by [`swapped_for_azurite`]).
pub fn sample_deployment_values() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        (
            "storageBlobEndpoint",
            "https://spotworkerabc123.blob.core.windows.net/".to_owned(),
        ),
        (
            "identityClientId",
            "00000000-0000-0000-0000-000000000001".to_owned(),
        ),
        ("queueName", "jobs".to_owned()),
        ("checkpointContainer", "checkpoints".to_owned()),
        ("resultsContainer", "results".to_owned()),
        (
            "appInsightsConnectionString",
            "InstrumentationKey=00000000-0000-0000-0000-000000000002;IngestionEndpoint=https://westeurope-5.in.applicationinsights.azure.com/".to_owned(),
        ),
        (
            "workerBinaryUrl",
            "https://spotworkerabc123.blob.core.windows.net/artifacts/spot-worker-primes".to_owned(),
        ),
        ("workerBinarySha256", "0".repeat(64)),
        // The default deployment: the binary is the worker, no bundle.
        ("workerArgs", String::new()),
        ("workerBundleUrl", String::new()),
        ("workerBundleSha256", String::new()),
        // The Spot lane's scale set, with the regular lane deployed (the
        // default), one job per CPU.
        ("lane", "spot".to_owned()),
        ("regularQueueName", "jobs-regular".to_owned()),
        ("concurrency", String::new()),
        // main.bicep's default scaleInProtection (true): the worker protects
        // its VM, and autoscale scales in promptly.
        ("scaleInProtection", "on".to_owned()),
    ])
}

/// The VM's environment with only what cannot exist off Azure swapped:
/// Azurite's connection string for the account URL and managed identity,
/// the emulator for IMDS, a free health port, no Application Insights
/// export, no scale-in protection (its calls go to Azure Resource Manager,
/// which has no stand-in here: `crates/azure/tests/it/scale_in_protection.rs`
/// runs them against one); plus systemd's default `PATH`.
/// A VM of the deployment off Azure: its IMDS emulator, a free health
/// port, and its environment swapped for them and Azurite
/// ([`swapped_for_azurite`]).
pub struct LocalVm {
    pub emulator: RunningEmulator,
    pub health_port: u16,
    pub env: BTreeMap<String, String>,
}

/// Starts the IMDS emulator of the VM `vm` and swaps `env` (as rendered)
/// for it, a free health port and `azurite`.
pub async fn local_vm(env: &BTreeMap<String, String>, azurite: &Azurite, vm: &str) -> LocalVm {
    let emulator = Emulator::start(EmulatorConfig::for_vm(vm))
        .await
        .expect("the emulator starts");
    let health_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = swapped_for_azurite(
        env,
        &azurite.connection_string(),
        &emulator.url(),
        health_port,
    );
    LocalVm {
        emulator,
        health_port,
        env,
    }
}

pub fn swapped_for_azurite(
    env: &BTreeMap<String, String>,
    connection_string: &str,
    imds_url: &str,
    health_port: u16,
) -> BTreeMap<String, String> {
    let mut swapped = env.clone();
    swapped.remove("SPOT_WORKER_STORAGE_ACCOUNT_URL");
    swapped.remove("AZURE_CLIENT_ID");
    swapped.remove("APPLICATIONINSIGHTS_CONNECTION_STRING");
    swapped.insert("SPOT_WORKER_SCALE_IN_PROTECTION".into(), "off".into());
    swapped.insert(
        "AZURE_STORAGE_CONNECTION_STRING".into(),
        connection_string.to_owned(),
    );
    swapped.insert("SPOT_WORKER_IMDS_ENDPOINT".into(), imds_url.to_owned());
    swapped.insert(
        "SPOT_WORKER_HEALTH_ADDR".into(),
        format!("127.0.0.1:{health_port}"),
    );
    // systemd's default PATH for services; the worker runs nothing else.
    swapped.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    swapped
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>/examples/primes`, next to this test's `deps/` folder.
pub fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps");
    let binary = profile_dir
        .join("examples")
        .join(format!("primes{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "the worker binary {} does not exist: run `cargo test` (which builds examples) \
         or `cargo build --example primes` first",
        binary.display()
    );
    binary
}

/// Evaluates compute.bicep's `var` chain: `loadTextContent('…')`,
/// `replace(var, '{{token}}', expr)`, `base64(var)`, `'literals'`, vars and
/// parameters.
pub fn render_compute_vars(params: &BTreeMap<&str, String>) -> BTreeMap<String, String> {
    let compute = repo().join("bicep/modules/compute.bicep");
    let text = std::fs::read_to_string(&compute).unwrap();
    let mut vars = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("var ") else {
            continue;
        };
        let (name, expr) = rest.split_once(" = ").expect("var NAME = EXPR");
        let value = evaluate(expr.trim(), &vars, params, compute.parent().unwrap());
        vars.insert(name.to_owned(), value);
    }
    vars
}

fn evaluate(
    expr: &str,
    vars: &BTreeMap<String, String>,
    params: &BTreeMap<&str, String>,
    dir: &Path,
) -> String {
    if let Some(path) = expr
        .strip_prefix("loadTextContent('")
        .and_then(|e| e.strip_suffix("')"))
    {
        return std::fs::read_to_string(dir.join(path)).unwrap();
    }
    if let Some(inner) = expr
        .strip_prefix("base64(")
        .and_then(|e| e.strip_suffix(')'))
    {
        return base64_encode(evaluate(inner, vars, params, dir).as_bytes());
    }
    if let Some(args) = expr
        .strip_prefix("replace(")
        .and_then(|e| e.strip_suffix(')'))
    {
        let (source, rest) = args.split_once(", '").expect("replace(var, 'token', expr)");
        let (token, with) = rest.split_once("', ").expect("replace(var, 'token', expr)");
        return evaluate(source, vars, params, dir)
            .replace(token, &evaluate(with, vars, params, dir));
    }
    if let Some(literal) = expr
        .strip_prefix('\'')
        .and_then(|e| e.strip_suffix('\''))
        .filter(|e| !e.contains('\''))
    {
        return literal.to_owned();
    }
    if let Some(value) = vars.get(expr) {
        return value.clone();
    }
    if let Some(value) = params.get(expr) {
        return value.clone();
    }
    panic!(
        "tests/it/deploy.rs cannot evaluate compute.bicep expression {expr:?}: extend evaluate()"
    );
}

/// The `write_files` of the rendered cloud-config (`path` → decoded content).
/// The document is ours: each entry has `- path:` and a one-line base64
/// `content:`; `cloud-init schema` validates it in scripts/test.sh.
pub fn written_files(cloud_config: &str) -> BTreeMap<String, String> {
    assert!(cloud_config.starts_with("#cloud-config\n"));
    let mut files = BTreeMap::new();
    let mut path = None;
    for line in cloud_config.lines() {
        let line = line.trim();
        if let Some(p) = line.strip_prefix("- path: ") {
            path = Some(p.to_owned());
        } else if let Some(content) = line.strip_prefix("content: ") {
            let path = path.take().expect("content follows its path");
            let bytes = base64_decode(content);
            files.insert(path, String::from_utf8(bytes).expect("text files"));
        }
    }
    files
}

/// `KEY=VALUE` lines as systemd's `EnvironmentFile=` reads them (comments,
/// blank lines, optional double quotes).
pub fn parse_env_file(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .map(|l| {
            let (k, v) = l.split_once('=').expect("KEY=VALUE");
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(v);
            (k.trim().to_owned(), v.to_owned())
        })
        .collect()
}

/// An `ExecStart=` value split into words as systemd splits it: whitespace
/// separates, double or single quotes group (a backslash escapes inside
/// them), `%%` is `%` and `$$` is `$`. A lone `%` or `$` (a specifier or a
/// variable systemd would expand) is refused: the templates must escape
/// them, so what the VM runs is what the deployment wrote.
pub fn exec_start_words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = value.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), '\\') => {
                let escaped = chars.next().expect("a backslash escapes a character");
                word.get_or_insert_with(String::new).push(escaped);
            }
            (_, '%' | '$') => {
                assert_eq!(
                    chars.next(),
                    Some(c),
                    "ExecStart has an unescaped {c:?} systemd would expand: {value}"
                );
                word.get_or_insert_with(String::new).push(c);
            }
            (_, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "ExecStart has an unclosed quote: {value}");
    words.extend(word);
    words
}

#[test]
fn exec_start_is_split_as_systemd_splits_it() {
    for (value, words) in [
        ("/bin/worker", vec!["/bin/worker"]),
        (
            "/bin/worker  run -- a",
            vec!["/bin/worker", "run", "--", "a"],
        ),
        (
            r#"w --label "100%% of $$HOME" 'x y'"#,
            vec!["w", "--label", "100% of $HOME", "x y"],
        ),
        (r#"w "a \"b\"" ''"#, vec!["w", r#"a "b""#, ""]),
        ("w {job_key}.json", vec!["w", "{job_key}.json"]),
    ] {
        assert_eq!(exec_start_words(value), words, "{value}");
    }
    for refused in ["w 100%", "w $HOME", "w \"open"] {
        assert!(
            std::panic::catch_unwind(|| exec_start_words(refused)).is_err(),
            "{refused} is refused"
        );
    }
}

#[test]
fn the_worker_protects_its_vm_exactly_when_autoscale_scales_in_promptly() {
    for enabled in [true, false] {
        let switch = scale_in_switch(&repo(), enabled);
        assert_eq!(
            switch.per_scale_set.len(),
            2,
            "main.bicep passes scaleInProtection to both lanes' scale sets"
        );
        for (setting, lane) in switch.per_scale_set.iter().zip(["spot", "regular"]) {
            let mut values = sample_deployment_values();
            values.insert("scaleInProtection", setting.clone());
            values.insert("lane", lane.to_owned());
            let env = render(&values).env;
            let protects = env
                .get("SPOT_WORKER_SCALE_IN_PROTECTION")
                .map(String::as_str);
            assert_eq!(
                protects == Some("on"),
                switch.prompt_rule,
                "scaleInProtection={enabled}, {lane} lane: the worker's setting is {protects:?}, \
                 the prompt scale-in rule {}deployed",
                if switch.prompt_rule { "" } else { "not " }
            );
            assert!(
                matches!(protects, Some("on" | "off")),
                "{lane} lane: {protects:?}"
            );
        }
        assert_eq!(switch.prompt_rule, enabled, "scaleInProtection={enabled}");
    }
}

/// `Key=value` settings of a unit file (last one wins, as in systemd).
pub fn unit_settings(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

pub fn seconds(text: &str) -> u64 {
    text.strip_suffix('s')
        .unwrap_or(text)
        .parse()
        .unwrap_or_else(|_| panic!("{text:?} is not a number of seconds"))
}

/// Whether `text` still has a `{{name}}` the rendering should have filled.
pub fn has_placeholder(text: &str) -> bool {
    text.split("{{").skip(1).any(|rest| {
        rest.split_once("}}").is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric())
        })
    })
}

/// The rendered unit and environment, as systemd on the VM would use them,
/// and the install script cloud-init runs.
pub struct Rendered {
    pub unit: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub install_script: String,
}

/// Renders the VM's files for the deployment `values` (what `main.bicep`
/// passes to `modules/compute.bicep`).
pub fn render(values: &BTreeMap<&str, String>) -> Rendered {
    let vars = render_compute_vars(values);
    let files = written_files(&vars["cloudInit"]);
    let unit_text = files.get(UNIT_FILE).expect("cloud-init writes the unit");
    let unit = unit_settings(unit_text);
    assert_eq!(
        unit.get("EnvironmentFile").map(String::as_str),
        Some(ENV_FILE)
    );
    let env_text = files.get(ENV_FILE).expect("cloud-init writes the env file");
    for (path, text) in &files {
        assert!(
            !has_placeholder(text),
            "unfilled {{{{placeholder}}}} in {path}:\n{text}"
        );
    }
    let env = parse_env_file(env_text);
    // The unit may also set Environment= lines; they come after the file.
    let mut env = env;
    for line in unit_text.lines() {
        if let Some(assignment) = line.trim().strip_prefix("Environment=") {
            let (k, v) = assignment.split_once('=').unwrap();
            env.insert(k.to_owned(), v.trim_matches('"').to_owned());
        }
    }
    let install_script = files
        .get(INSTALL_SCRIPT)
        .expect("cloud-init writes the install script")
        .clone();
    Rendered {
        unit,
        env,
        install_script,
    }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (what Bicep's `base64()` produces).
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut n = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET
            .iter()
            .position(|&a| a == c)
            .unwrap_or_else(|| panic!("not base64: {c:?}")) as u32;
        n = (n << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((n >> bits) as u8);
        }
    }
    out
}

#[test]
fn base64_round_trips() {
    for text in ["", "a", "ab", "abc", "abcd", "[Unit]\nDescription=x\n"] {
        assert_eq!(
            base64_decode(&base64_encode(text.as_bytes())),
            text.as_bytes()
        );
    }
    assert_eq!(base64_encode(b"spot"), "c3BvdA==");
}
