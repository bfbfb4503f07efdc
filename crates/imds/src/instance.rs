//! What is read from instance metadata: this VM's name, and its size and
//! priority (what it is paid at, for the fleet's bill).
//!
//! Kept apart from the HTTP client so the parse of a body that anything on
//! the metadata address may have sent is a pure function, tested on its own
//! with generated input (see its property test below).

use serde::Deserialize;

use crate::error::{ImdsError, parse_json};

/// `compute.name` of an instance metadata document (`GET /metadata/instance`);
/// every other field is ignored.
pub(crate) fn vm_name(body: &[u8]) -> Result<String, ImdsError> {
    #[derive(Deserialize)]
    struct Compute {
        name: String,
    }
    let instance: Instance<Compute> = parse_json("instance metadata", body)?;
    Ok(instance.compute.name)
}

/// What this VM is paid at, from instance metadata: `compute.vmSize`
/// (`Standard_D4s_v5`) and `compute.priority` (`Spot`, `Regular`, or
/// `Low`). A field the document leaves out or empty is `None`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmKind {
    /// `compute.vmSize`.
    pub vm_size: Option<String>,
    /// `compute.priority`.
    pub priority: Option<String>,
}

/// An instance metadata document, of which the worker reads only parts of
/// `compute` (each reader names its part as `C`).
#[derive(Deserialize)]
pub(crate) struct Instance<C> {
    /// The VM's own fields.
    pub(crate) compute: C,
}

/// `compute.vmSize` and `compute.priority` of an instance metadata
/// document; every other field is ignored.
pub(crate) fn vm_kind(body: &[u8]) -> Result<VmKind, ImdsError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Compute {
        #[serde(default)]
        vm_size: String,
        #[serde(default)]
        priority: String,
    }
    let instance: Instance<Compute> = parse_json("instance metadata", body)?;
    let given = |text: String| Some(text.trim().to_owned()).filter(|t| !t.is_empty());
    Ok(VmKind {
        vm_size: given(instance.compute.vm_size),
        priority: given(instance.compute.priority),
    })
}

#[cfg(test)]
mod bad_input;

#[cfg(test)]
mod kind_tests {
    use super::*;

    #[test]
    fn size_and_priority_are_read_and_absent_ones_are_none() {
        let table: [(&str, Option<&str>, Option<&str>); 4] = [
            (
                r#"{"compute":{"name":"vm","vmSize":"Standard_D4s_v5","priority":"Spot"}}"#,
                Some("Standard_D4s_v5"),
                Some("Spot"),
            ),
            (
                r#"{"compute":{"vmSize":"Standard_F2s_v2","priority":""}}"#,
                Some("Standard_F2s_v2"),
                None,
            ),
            (r#"{"compute":{"name":"vm"}}"#, None, None),
            (
                r#"{"compute":{"vmSize":" ","priority":"Regular"}}"#,
                None,
                Some("Regular"),
            ),
        ];
        for (body, size, priority) in table {
            let kind = vm_kind(body.as_bytes()).unwrap();
            assert_eq!(kind.vm_size.as_deref(), size, "{body}");
            assert_eq!(kind.priority.as_deref(), priority, "{body}");
        }
        assert!(vm_kind(b"<html>not found</html>").is_err());
    }
}
