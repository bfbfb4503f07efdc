//! Where this VM sits in its scale set, from instance metadata: what the
//! worker needs to name its own instance in an ARM call (issue 39: it
//! protects its VM from scale-in while it holds work).
//!
//! A pure parse of `GET /metadata/instance`, like [`crate::instance`]: the
//! subscription, resource group, scale set and instance id, and the cloud
//! (`compute.azEnvironment`) whose ARM endpoint serves them. A Uniform
//! scale set's VM has a `resourceId` ending in
//! `virtualMachineScaleSets/{set}/virtualMachines/{instance-id}`; a Flexible
//! one's is a plain `virtualMachines/{name}`, and its instance id in the
//! scale set's VM API is that name.

use serde::Deserialize;

use crate::instance::Instance;

use crate::error::{ImdsError, parse_json};

/// This VM as a member of a scale set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScaleSetMember {
    /// `compute.subscriptionId`.
    pub subscription_id: String,
    /// `compute.resourceGroupName`.
    pub resource_group: String,
    /// `compute.vmScaleSetName`.
    pub scale_set: String,
    /// The instance id in the scale set's VM API: the number of a Uniform
    /// instance, the VM name of a Flexible one.
    pub instance_id: String,
    /// `compute.azEnvironment` (`AzurePublicCloud`, ...).
    pub environment: String,
}

/// This VM's place in its scale set, or `None` when it is in none
/// (`vmScaleSetName` empty).
pub(crate) fn scale_set_member(body: &[u8]) -> Result<Option<ScaleSetMember>, ImdsError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Compute {
        name: String,
        #[serde(default)]
        vm_scale_set_name: String,
        resource_group_name: String,
        subscription_id: String,
        #[serde(default)]
        resource_id: String,
        #[serde(default)]
        az_environment: String,
    }
    let instance: Instance<Compute> = parse_json("instance metadata", body)?;
    let compute = instance.compute;
    if compute.vm_scale_set_name.trim().is_empty() {
        return Ok(None);
    }
    let instance_id = uniform_instance_id(&compute.resource_id, &compute.vm_scale_set_name)
        .unwrap_or(compute.name);
    Ok(Some(ScaleSetMember {
        subscription_id: compute.subscription_id,
        resource_group: compute.resource_group_name,
        scale_set: compute.vm_scale_set_name,
        instance_id,
        environment: compute.az_environment,
    }))
}

/// The instance id at the end of a Uniform instance's resource id
/// (`…/virtualMachineScaleSets/{set}/virtualMachines/{id}`), if it is one.
fn uniform_instance_id(resource_id: &str, scale_set: &str) -> Option<String> {
    let mut segments = resource_id.rsplit('/');
    let id = segments.next()?;
    let kind = segments.next()?;
    let set = segments.next()?;
    let set_kind = segments.next()?;
    (kind.eq_ignore_ascii_case("virtualMachines")
        && set_kind.eq_ignore_ascii_case("virtualMachineScaleSets")
        && set.eq_ignore_ascii_case(scale_set)
        && !id.is_empty())
    .then(|| id.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document(name: &str, set: &str, resource_id: &str) -> Vec<u8> {
        serde_json::json!({"compute": {
            "name": name, "vmScaleSetName": set, "resourceGroupName": "rg",
            "subscriptionId": "sub", "resourceId": resource_id,
            "azEnvironment": "AzurePublicCloud", "location": "westeurope"
        }})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn members_of_uniform_and_flexible_sets_and_vms_in_none() {
        let prefix = "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute";
        // (name, scale set, resource id, expected instance id)
        let table = [
            (
                "workers_7",
                "workers",
                format!("{prefix}/virtualMachineScaleSets/workers/virtualMachines/7"),
                Some("7"),
            ),
            (
                "workers_a1b2c3",
                "workers",
                format!("{prefix}/virtualMachines/workers_a1b2c3"),
                Some("workers_a1b2c3"),
            ),
            // A resource id of another set is not trusted for the id.
            (
                "vm1",
                "workers",
                format!("{prefix}/virtualMachineScaleSets/other/virtualMachines/3"),
                Some("vm1"),
            ),
            (
                "lonely",
                "",
                format!("{prefix}/virtualMachines/lonely"),
                None,
            ),
            ("lonely", "  ", String::new(), None),
        ];
        for (name, set, resource_id, expected) in table {
            let member = scale_set_member(&document(name, set, &resource_id)).unwrap();
            assert_eq!(
                member.as_ref().map(|m| m.instance_id.as_str()),
                expected,
                "{name} {resource_id}"
            );
            if let Some(member) = member {
                assert_eq!(member.scale_set, set);
                assert_eq!(member.resource_group, "rg");
                assert_eq!(member.subscription_id, "sub");
                assert_eq!(member.environment, "AzurePublicCloud");
            }
        }
    }

    #[test]
    fn a_document_without_the_fields_is_refused_with_its_reason() {
        for body in [
            &br#"{"compute": {"name": "a", "vmScaleSetName": "s"}}"#[..],
            b"not json",
            br#"{"compute": {"name": "a", "vmScaleSetName": 3, "resourceGroupName": "r", "subscriptionId": "s"}}"#,
        ] {
            let error = scale_set_member(body).unwrap_err();
            assert!(
                error.to_string().contains("instance metadata"),
                "{error}"
            );
        }
    }
}
