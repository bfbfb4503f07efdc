//! The one thing read from instance metadata: this VM's name.
//!
//! Kept apart from the HTTP client so the parse of a body that anything on
//! the metadata address may have sent is a pure function, tested on its own
//! with generated input (see its property test below).

use serde::Deserialize;

use crate::client::parse_json;
use crate::error::ImdsError;

/// `compute.name` of an instance metadata document (`GET /metadata/instance`);
/// every other field is ignored.
pub(crate) fn vm_name(body: &[u8]) -> Result<String, ImdsError> {
    #[derive(Deserialize)]
    struct Instance {
        compute: Compute,
    }
    #[derive(Deserialize)]
    struct Compute {
        name: String,
    }
    let instance: Instance = parse_json("instance metadata", body)?;
    Ok(instance.compute.name)
}

#[cfg(test)]
mod bad_input;
