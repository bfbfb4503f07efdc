//! The program's environment: the worker's, without its credentials, plus
//! what the operator passes on purpose (`--pass-env`).

use std::ffi::OsString;
use std::sync::Arc;

/// Decides whether an environment variable of the worker is a secret the
/// program must not see, from its name and value.
pub type SecretRule = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// Name fragments that mark a credential, matched in upper case anywhere in
/// the name.
const SECRET_FRAGMENTS: [&str; 9] = [
    "CONNECTION_STRING",
    "CONNECTIONSTRING",
    "ACCOUNT_KEY",
    "ACCESS_KEY",
    "SAS",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "CREDENTIAL",
];

/// Name prefixes of identity and storage settings: `AZURE_*` (the
/// identity variables of the Azure SDKs and CLI), the managed identity
/// endpoints of App Service and Arc (`IDENTITY_*`, `MSI_*`), the worker's
/// storage account, and Application Insights' settings.
const SECRET_PREFIXES: [&str; 5] = [
    "AZURE_",
    "IDENTITY_",
    "MSI_",
    "SPOT_WORKER_STORAGE_",
    "APPLICATIONINSIGHTS_",
];

/// The OpenTelemetry exporters' headers, which carry keys:
/// `OTEL_EXPORTER_OTLP_HEADERS` and the per-signal ones
/// (`OTEL_EXPORTER_OTLP_TRACES_HEADERS`, `_METRICS_`, `_LOGS_`, and any
/// signal to come): the names that start with the first and end with the
/// second.
const OTLP_HEADERS: (&str, &str) = ("OTEL_EXPORTER_OTLP_", "_HEADERS");

/// Value fragments of credentials (lower case): an account key or a SAS
/// signature in a connection string or URL, a bearer token (as written,
/// or URL-encoded as OTLP headers carry it: `Authorization=Bearer%20...`),
/// an API key header (`api-key=...`, Azure's and many exporters').
const SECRET_VALUE_FRAGMENTS: [&str; 6] = [
    "accountkey=",
    "sig=",
    "sharedaccesssignature=",
    "bearer ",
    "bearer%20",
    "api-key=",
];

/// The shortest run of token characters after `basic ` that counts as
/// HTTP basic credentials (base64 of at least `a:bcd`).
const MIN_BASIC_TOKEN: usize = 8;

/// The built-in rule: a credential by its name or by its value.
///
/// ```
/// use spot_worker_command::is_secret;
///
/// assert!(is_secret("AZURE_STORAGE_CONNECTION_STRING", "UseDevelopmentStorage=true"));
/// assert!(is_secret("AZURE_CLIENT_ID", "00000000-0000-0000-0000-000000000000"));
/// assert!(is_secret("MY_URL", "https://a.blob.core.windows.net/c?sv=1&sig=abc"));
/// assert!(!is_secret("PATH", "/usr/bin:/bin"));
/// ```
pub fn is_secret(name: &str, value: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    let lower_value = value.to_ascii_lowercase();
    SECRET_PREFIXES
        .iter()
        .any(|prefix| upper.starts_with(prefix))
        || (upper.starts_with(OTLP_HEADERS.0) && upper.ends_with(OTLP_HEADERS.1))
        || SECRET_FRAGMENTS
            .iter()
            .any(|fragment| upper.contains(fragment))
        || upper.ends_with("_KEY")
        || SECRET_VALUE_FRAGMENTS
            .iter()
            .any(|fragment| lower_value.contains(fragment))
        || has_basic_credentials(&lower_value)
}

/// Whether `lower_value` (lower case) carries HTTP basic credentials: the
/// scheme `basic` where a header value starts (at the start, or after `=`,
/// `:` or `,`), then a space (or `%20`, URL-encoded) and a token of at
/// least [`MIN_BASIC_TOKEN`] characters. The word in a sentence ("a basic
/// test") is not one.
fn has_basic_credentials(lower_value: &str) -> bool {
    lower_value.match_indices("basic").any(|(at, _)| {
        let before = lower_value[..at].trim_end_matches(' ');
        let starts_a_value = before.is_empty() || before.ends_with(['=', ':', ',']);
        let rest = &lower_value[at + "basic".len()..];
        let token = rest
            .strip_prefix("%20")
            .or_else(|| rest.strip_prefix(' '))
            .map(|token| token.trim_start_matches(' '));
        starts_a_value
            && token.is_some_and(|token| {
                token
                    .chars()
                    .take_while(|c| {
                        c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '%' | '-' | '_')
                    })
                    .count()
                    >= MIN_BASIC_TOKEN
            })
    })
}

/// The program's environment: every variable of `worker_env` that `secret`
/// does not reject, those named in `pass` whatever `secret` says, then
/// `contract` (the `SPOT_WORKER_*` variables of the delivery) over both.
///
/// Names and values need not be UTF-8 (`std::env::vars_os`); the rule sees
/// them lossily decoded.
pub fn child_env(
    worker_env: impl IntoIterator<Item = (OsString, OsString)>,
    secret: &dyn Fn(&str, &str) -> bool,
    pass: &[String],
    contract: &[(&'static str, String)],
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = worker_env
        .into_iter()
        .filter(|(name, value)| !is_withheld(name, value, secret, pass))
        .filter(|(name, _)| !contract.iter().any(|(set, _)| name == set))
        .collect();
    env.extend(
        contract
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value))),
    );
    env
}

/// The names of the variables of `worker_env` that programs do not get
/// ([`child_env`] leaves them out), sorted: for a log that says so.
///
/// ```
/// use std::ffi::OsString;
/// use spot_worker_command::{is_secret, withheld_names};
///
/// let env = [("PATH", "/bin"), ("HF_TOKEN", "t"), ("GITHUB_TOKEN", "g")]
///     .map(|(n, v)| (OsString::from(n), OsString::from(v)));
/// assert_eq!(withheld_names(env, &is_secret, &["HF_TOKEN".to_owned()]), ["GITHUB_TOKEN"]);
/// ```
pub fn withheld_names(
    worker_env: impl IntoIterator<Item = (OsString, OsString)>,
    secret: &dyn Fn(&str, &str) -> bool,
    pass: &[String],
) -> Vec<String> {
    let mut names: Vec<String> = worker_env
        .into_iter()
        .filter(|(name, value)| is_withheld(name, value, secret, pass))
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Whether the variable `name` (with `value`) is kept from programs: the
/// rule says it is secret and `pass` does not name it.
fn is_withheld(
    name: &OsString,
    value: &OsString,
    secret: &dyn Fn(&str, &str) -> bool,
    pass: &[String],
) -> bool {
    let name = name.to_string_lossy();
    !pass.iter().any(|passed| *passed == name) && secret(&name, &value.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_by_name_and_value() {
        // (name, value, secret)
        let rows = [
            (
                "AZURE_STORAGE_CONNECTION_STRING",
                "UseDevelopmentStorage=true",
                true,
            ),
            ("AZURE_CLIENT_ID", "id", true),
            ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token", true),
            (
                "IDENTITY_ENDPOINT",
                "http://localhost:42356/msi/token",
                true,
            ),
            ("IDENTITY_HEADER", "h", true),
            ("MSI_SECRET", "s", true),
            ("SPOT_WORKER_STORAGE_ACCOUNT_URL", "acct", true),
            (
                "APPLICATIONINSIGHTS_CONNECTION_STRING",
                "InstrumentationKey=x",
                true,
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=x", true),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=a", true),
            ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-tenant=a", true),
            ("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "x-tenant=a", true),
            ("otel_exporter_otlp_traces_headers", "x-tenant=a", true),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://127.0.0.1:4318",
                false,
            ),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip", false),
            ("UPSTREAM", "Authorization=Basic dXNlcjpwYXNzd29yZA==", true),
            ("UPSTREAM", "basic dXNlcjpwYXNzd29yZA==", true),
            ("UPSTREAM", "authorization: Basic dXNlcjpwYXNz", true),
            (
                "UPSTREAM",
                "Authorization=Basic%20dXNlcjpwYXNzd29yZA==",
                true,
            ),
            ("UPSTREAM", "Authorization=Bearer%20eyJ0eXAi", true),
            ("EXPORT", "api-key=0123,x-team=a", true),
            ("EXPORT", "x-team=a,api-key=0123", true),
            ("DESCRIPTION", "a basic test of the basic path", false),
            ("MODE", "basic", false),
            ("MODE", "auth=basic", false),
            ("GITHUB_TOKEN", "x", true),
            ("DB_PASSWORD", "x", true),
            ("MY_SAS", "x", true),
            ("STRIPE_KEY", "x", true),
            (
                "SOMETHING",
                "DefaultEndpointsProtocol=https;AccountKey=abc",
                true,
            ),
            (
                "UPLOAD_URL",
                "https://a.blob.core.windows.net/c?sv=1&sig=abc",
                true,
            ),
            ("AUTH", "Bearer eyJ0", true),
            ("PATH", "/usr/bin", false),
            ("HOME", "/home/worker", false),
            ("SPOT_WORKER_QUEUE", "jobs", false),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://127.0.0.1:4318",
                false,
            ),
            ("LANG", "C.UTF-8", false),
            ("KEYBOARD", "us", false),
        ];
        for (name, value, expected) in rows {
            assert_eq!(is_secret(name, value), expected, "{name}={value}");
        }
    }

    #[test]
    fn the_environment_drops_secrets_keeps_passed_and_sets_the_contract() {
        let worker = [
            ("PATH", "/bin"),
            ("AZURE_STORAGE_CONNECTION_STRING", "AccountKey=k"),
            ("HF_TOKEN", "t"),
            ("SPOT_WORKER_JOB_KEY", "job_id"),
        ]
        .map(|(n, v)| (OsString::from(n), OsString::from(v)));
        let env = child_env(
            worker,
            &is_secret,
            &["HF_TOKEN".to_owned()],
            &[("SPOT_WORKER_JOB_KEY", "j1".to_owned())],
        );
        let names: Vec<(&str, &str)> = env
            .iter()
            .map(|(n, v)| (n.to_str().unwrap(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("PATH", "/bin"),
                ("HF_TOKEN", "t"),
                ("SPOT_WORKER_JOB_KEY", "j1")
            ]
        );
    }
}
