//! Configuration of an emulated VM and of the emulator's service behaviour.

use std::time::Duration;

use crate::identities::IdentityConfig;

/// How the emulated VM looks and how the emulated service behaves.
///
/// The defaults describe instance 0 of a Spot scale set called `spotvmss`
/// (`spotvmss_0`), rate-limited like the real IMDS (5 requests per second)
/// and without the first-call delay.
#[derive(Debug, Clone, PartialEq)]
pub struct EmulatorConfig {
    /// The VM's name, as listed in `Resources` and in `compute.name`.
    pub vm_name: String,
    /// The scale set the VM belongs to, if any (`compute.vmScaleSetName`).
    pub scale_set_name: Option<String>,
    /// Azure region reported by the instance endpoint.
    pub location: String,
    /// Resource group reported by the instance endpoint.
    pub resource_group: String,
    /// Subscription id reported by the instance endpoint.
    pub subscription_id: String,
    /// VM size reported by the instance endpoint.
    pub vm_size: String,
    /// Maximum IMDS requests per sliding one-second window; `None` disables
    /// the limit.
    pub rate_limit_per_sec: Option<u32>,
    /// Delay of the very first Scheduled Events GET (the real service takes
    /// up to two minutes when Scheduled Events is first enabled).
    pub first_call_delay: Duration,
    /// The VM's managed identities and the tokens the identity endpoint
    /// issues (none by default: a VM without identities).
    pub identity: IdentityConfig,
}

impl Default for EmulatorConfig {
    fn default() -> Self {
        Self::for_vm("spotvmss_0")
    }
}

impl EmulatorConfig {
    /// A configuration for the VM called `vm_name`.
    ///
    /// Scale set instances are named `{scale-set-name}_{instance-id}`, so a
    /// name of that shape also sets [`scale_set_name`](Self::scale_set_name).
    ///
    /// ```
    /// use spot_worker_imds_emulator::EmulatorConfig;
    ///
    /// assert_eq!(EmulatorConfig::for_vm("web_3").scale_set_name.as_deref(), Some("web"));
    /// assert_eq!(EmulatorConfig::for_vm("standalone").scale_set_name, None);
    /// ```
    pub fn for_vm(vm_name: impl Into<String>) -> Self {
        let vm_name = vm_name.into();
        let scale_set_name = split_instance_name(&vm_name).map(|(set, _)| set.to_owned());
        Self {
            vm_name,
            scale_set_name,
            location: "westeurope".to_owned(),
            resource_group: "spot-worker-rg".to_owned(),
            subscription_id: "8d10da13-8125-4ba9-a717-bf7490507b3d".to_owned(),
            vm_size: "Standard_D2s_v5".to_owned(),
            rate_limit_per_sec: Some(5),
            first_call_delay: Duration::ZERO,
            identity: IdentityConfig::default(),
        }
    }

    /// A second VM in the same placement group, used by the scenarios in which
    /// an event affects (also) another VM: the next instance of the scale set,
    /// or `{vm_name}-2` for a standalone VM.
    pub fn peer_vm_name(&self) -> String {
        match split_instance_name(&self.vm_name) {
            Some((set, id)) => format!("{set}_{}", id.saturating_add(1)),
            None => format!("{}-2", self.vm_name),
        }
    }

    /// The ARM resource id of the VM, as the instance endpoint reports it.
    pub fn resource_id(&self) -> String {
        let prefix = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute",
            self.subscription_id, self.resource_group
        );
        match (&self.scale_set_name, split_instance_name(&self.vm_name)) {
            (Some(set), Some((_, id))) => {
                format!("{prefix}/virtualMachineScaleSets/{set}/virtualMachines/{id}")
            }
            _ => format!("{prefix}/virtualMachines/{}", self.vm_name),
        }
    }
}

/// Splits `{scale-set-name}_{instance-id}` into its parts.
fn split_instance_name(name: &str) -> Option<(&str, u64)> {
    let (set, id) = name.rsplit_once('_')?;
    if set.is_empty() {
        return None;
    }
    Some((set, id.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_scale_set_instance_zero() {
        let config = EmulatorConfig::default();
        assert_eq!(config.vm_name, "spotvmss_0");
        assert_eq!(config.scale_set_name.as_deref(), Some("spotvmss"));
        assert_eq!(config.peer_vm_name(), "spotvmss_1");
        assert!(
            config
                .resource_id()
                .ends_with("/virtualMachineScaleSets/spotvmss/virtualMachines/0")
        );
    }

    #[test]
    fn standalone_vm() {
        let config = EmulatorConfig::for_vm("myvm");
        assert_eq!(config.scale_set_name, None);
        assert_eq!(config.peer_vm_name(), "myvm-2");
        assert!(config.resource_id().ends_with("/virtualMachines/myvm"));
    }
}
