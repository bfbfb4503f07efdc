//! The Role and RoleBinding the stand-in authorises by, read from
//! `deploy/kubernetes/pod-deletion-cost.yaml` (the shipped manifest, not a
//! copy), and why the stand-in could not start.

use super::MANIFEST;

/// Why the stand-in could not start.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The manifest could not be read.
    #[error("reading the Role from {path}: {source}")]
    Read {
        /// The manifest's path.
        path: String,
        /// Why not.
        source: std::io::Error,
    },
    /// The manifest lacks something the stand-in authorises by.
    #[error("{path}: {what}")]
    Manifest {
        /// The manifest's path.
        path: String,
        /// What is missing or inconsistent.
        what: String,
    },
    /// The listener could not be bound.
    #[error("binding the Kubernetes API stand-in: {0}")]
    Bind(#[source] std::io::Error),
}

/// What the Role allows, and to whom its RoleBinding gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Role {
    /// The Role's namespace.
    pub namespace: String,
    /// Its one rule's API groups (`""`: the core group).
    pub api_groups: Vec<String>,
    /// Its one rule's resources.
    pub resources: Vec<String>,
    /// Its one rule's verbs.
    pub verbs: Vec<String>,
    /// `namespace/name` of the bound service account.
    pub subject: String,
}

impl Role {
    /// The manifest's Role, rendered for `namespace` as
    /// `scripts/deploy-aks.sh` renders it.
    pub fn from_manifest(namespace: &str) -> Result<Role, KubeError> {
        let path = crate::workspace_root().join(MANIFEST);
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|source| KubeError::Read {
            path: shown.clone(),
            source,
        })?;
        Role::parse(&text.replace("${NAMESPACE}", namespace))
            .map_err(|what| KubeError::Manifest { path: shown, what })
    }

    /// The Role of a rendered manifest (a Role with one rule and the
    /// RoleBinding that refers to it).
    pub(super) fn parse(text: &str) -> Result<Role, String> {
        let documents: Vec<&str> = text.split("\n---\n").collect();
        let find = |kind: &str| {
            documents
                .iter()
                .find(|d| d.contains(&format!("\nkind: {kind}\n")))
                .copied()
                .ok_or(format!("no {kind}"))
        };
        let role = find("Role")?;
        let binding = find("RoleBinding")?;
        let role_name = scalar(role, "name").ok_or("the Role has no name")?;
        let refers_to = binding
            .split("roleRef:")
            .nth(1)
            .and_then(|r| scalar(r, "name"));
        if refers_to.as_deref() != Some(role_name.as_str()) {
            return Err(format!(
                "the RoleBinding refers to {refers_to:?}, not the Role {role_name}"
            ));
        }
        if list(role, "rules").len() != 1 {
            return Err("the Role has not exactly one rule".into());
        }
        let subjects = binding
            .split("subjects:")
            .nth(1)
            .ok_or("the RoleBinding has no subjects")?;
        let subject_of = |key| scalar(subjects, key).ok_or(format!("the subject has no {key}"));
        Ok(Role {
            namespace: scalar(role, "namespace").ok_or("the Role has no namespace")?,
            api_groups: list(role, "apiGroups"),
            resources: list(role, "resources"),
            verbs: list(role, "verbs"),
            subject: format!("{}/{}", subject_of("namespace")?, subject_of("name")?),
        })
    }

    /// Whether the service account `subject` (`namespace/name`) may do
    /// `verb` on `resource` of `group` in `namespace`.
    pub fn allows(
        &self,
        subject: &str,
        namespace: &str,
        group: &str,
        resource: &str,
        verb: &str,
    ) -> bool {
        subject == self.subject
            && namespace == self.namespace
            && self.api_groups.iter().any(|g| g == group)
            && self.resources.iter().any(|r| r == resource)
            && self.verbs.iter().any(|v| v == verb)
    }
}

/// The first `key: value` in `text` (quotes removed).
fn scalar(text: &str, key: &str) -> Option<String> {
    let at = text.find(&format!("{key}: "))?;
    let rest = &text[at + key.len() + 2..];
    Some(rest.lines().next()?.trim().trim_matches('"').to_owned())
}

/// The items of the block list under `key:` (the `- item` lines at the
/// first item's indent, until a line less indented than that).
fn list(text: &str, key: &str) -> Vec<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut lines = text
        .lines()
        .skip_while(|l| l.trim_start().trim_start_matches("- ") != format!("{key}:"))
        .skip(1)
        .filter(|l| !l.trim().is_empty());
    let Some(first) = lines.next() else {
        return Vec::new();
    };
    let depth = indent(first);
    std::iter::once(first)
        .chain(lines.take_while(|l| indent(l) >= depth))
        .filter(|l| indent(l) == depth)
        .filter_map(|l| l.trim().strip_prefix("- "))
        .map(|item| item.trim().trim_matches('"').to_owned())
        .collect()
}
