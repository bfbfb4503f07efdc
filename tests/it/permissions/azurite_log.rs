//! Azurite's debug log read as the storage requests it served: for each
//! request (by Azurite's request id, in the order they arrived), the
//! service, the queue or container it named and the operation Azurite
//! dispatched it to, translated to the operation names of Microsoft's
//! permission table ("Permissions for calling data operations",
//! `tools/infra/azure-roles/storage-operations.json`).

use std::collections::BTreeMap;

/// One request as Azurite logged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Azurite's request id.
    pub id: String,
    /// `queue` or `blob`.
    pub service: &'static str,
    /// The queue or container named (empty: the account, a service-level
    /// operation such as List Queues).
    pub resource: String,
    /// Azurite's operation name (`Messages_Enqueue`), once dispatched.
    pub azurite_operation: Option<String>,
}

/// Every request in `log`, in the order of their first line.
pub fn requests(log: &str) -> Vec<Request> {
    let mut order: Vec<String> = Vec::new();
    let mut by_id: BTreeMap<String, Request> = BTreeMap::new();
    for line in log.lines() {
        let mut words = line.splitn(3, ' ');
        let (Some(_time), Some(id), Some(rest)) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        let context = if let Some(at) = rest.find("QueueStorageContextMiddleware: Account=") {
            Some(("queue", &rest[at..], " Queue="))
        } else {
            rest.find("BlobStorageContextMiddleware: Account=")
                .map(|at| ("blob", &rest[at..], " Container="))
        };
        if let Some((service, text, key)) = context {
            let resource = text
                .find(key)
                .map(|at| {
                    let value = &text[at + key.len()..];
                    value.split(' ').next().unwrap_or_default()
                })
                .unwrap_or_default();
            let resource = if resource == "undefined" {
                ""
            } else {
                resource
            };
            if !by_id.contains_key(id) {
                order.push(id.to_owned());
            }
            by_id
                .entry(id.to_owned())
                .or_insert_with(|| Request {
                    id: id.to_owned(),
                    service,
                    resource: String::new(),
                    azurite_operation: None,
                })
                .resource = resource.to_owned();
        } else if let Some(at) = rest.find("DispatchMiddleware: Operation=") {
            let operation = rest[at + "DispatchMiddleware: Operation=".len()..].trim();
            if let Some(request) = by_id.get_mut(id) {
                request.azurite_operation = Some(operation.to_owned());
            }
        }
    }
    order
        .into_iter()
        .filter_map(|id| by_id.remove(&id))
        .collect()
}

/// Azurite's operation name (by service) -> the REST operation's name in
/// Microsoft's permission table. An operation missing here fails the test:
/// add it, with the name the table uses.
pub fn rest_operation(service: &str, azurite: &str) -> Option<&'static str> {
    Some(match (service, azurite) {
        ("queue", "Service_ListQueuesSegment") => "List Queues",
        ("queue", "Service_GetProperties") => "Get Queue Service Properties",
        ("queue", "Service_SetProperties") => "Set Queue Service Properties",
        ("queue", "Service_GetStatistics") => "Get Queue Service Stats",
        ("queue", "Queue_Create") => "Create Queue",
        ("queue", "Queue_Delete") => "Delete Queue",
        ("queue", "Queue_GetProperties") => "Get Queue Metadata",
        ("queue", "Queue_SetMetadata") => "Set Queue Metadata",
        ("queue", "Queue_GetAccessPolicy") => "Get Queue ACL",
        ("queue", "Queue_SetAccessPolicy") => "Set Queue ACL",
        ("queue", "Messages_Enqueue") => "Put Message",
        ("queue", "Messages_Dequeue") => "Get Messages",
        ("queue", "Messages_Peek") => "Peek Messages",
        ("queue", "Messages_Clear") => "Clear Messages",
        ("queue", "MessageId_Update") => "Update Message",
        ("queue", "MessageId_Delete") => "Delete Message",
        ("blob", "Service_ListContainersSegment") => "List Containers",
        ("blob", "Service_GetProperties") => "Get Blob Service Properties",
        ("blob", "Service_SetProperties") => "Set Blob Service Properties",
        ("blob", "Service_GetUserDelegationKey") => "Get User Delegation Key",
        ("blob", "Service_GetAccountInfo" | "Container_GetAccountInfo" | "Blob_GetAccountInfo") => {
            "Get Account Information"
        }
        ("blob", "Container_Create") => "Create Container",
        ("blob", "Container_Delete") => "Delete Container",
        ("blob", "Container_GetProperties") => "Get Container Properties",
        ("blob", "Container_SetMetadata") => "Set Container Metadata",
        ("blob", "Container_GetAccessPolicy") => "Get Container ACL",
        ("blob", "Container_SetAccessPolicy") => "Set Container ACL",
        ("blob", "Container_ListBlobFlatSegment" | "Container_ListBlobHierarchySegment") => {
            "List Blobs"
        }
        ("blob", "Blob_Download") => "Get Blob",
        ("blob", "Blob_GetProperties") => "Get Blob Properties",
        ("blob", "Blob_SetHTTPHeaders") => "Set Blob Properties",
        ("blob", "Blob_SetMetadata") => "Set Blob Metadata",
        ("blob", "Blob_Delete") => "Delete Blob",
        ("blob", "Blob_Undelete") => "Undelete Blob",
        ("blob", "Blob_CreateSnapshot") => "Snapshot Blob",
        ("blob", "Blob_SetTier") => "Set Blob Tier",
        ("blob", "Blob_GetTags") => "Get Blob Tags",
        ("blob", "Blob_SetTags") => "Set Blob Tags",
        (
            "blob",
            "Blob_AcquireLease" | "Blob_ReleaseLease" | "Blob_RenewLease" | "Blob_ChangeLease"
            | "Blob_BreakLease",
        ) => "Lease Blob",
        ("blob", "BlockBlob_Upload") => "Put Blob",
        ("blob", "BlockBlob_StageBlock") => "Put Block",
        ("blob", "BlockBlob_CommitBlockList") => "Put Block List",
        ("blob", "BlockBlob_GetBlockList") => "Get Block List",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_in_order_with_their_resource_and_operation() {
        let log = "\
2026-11-25T23:48:11.698Z \t info: Azurite Table service successfully listens
2026-11-25T23:48:11.712Z aaa info: QueueStorageContextMiddleware: RequestMethod=PUT RequestURL=http://127.0.0.1/devstoreaccount1/jobs
2026-11-25T23:48:11.713Z aaa info: QueueStorageContextMiddleware: Account=devstoreaccount1 Queue=jobs Message=undefined MessageId=undefined
2026-11-25T23:48:11.731Z bbb info: BlobStorageContextMiddleware: Account=devstoreaccount1 Container=checkpoints Blob=
2026-11-25T23:48:11.714Z aaa info: DispatchMiddleware: Operation=Queue_Create
2026-11-25T23:48:11.732Z bbb info: DispatchMiddleware: Operation=Container_ListBlobFlatSegment
2026-11-25T23:48:11.733Z ccc info: QueueStorageContextMiddleware: Account=devstoreaccount1 Queue=undefined Message=undefined MessageId=undefined
";
        let got = requests(log);
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].service, got[0].resource.as_str()),
            ("queue", "jobs")
        );
        assert_eq!(got[0].azurite_operation.as_deref(), Some("Queue_Create"));
        assert_eq!(
            (got[1].service, got[1].resource.as_str()),
            ("blob", "checkpoints")
        );
        assert_eq!(
            rest_operation("blob", got[1].azurite_operation.as_deref().unwrap()),
            Some("List Blobs")
        );
        assert_eq!(
            got[2].resource, "",
            "a service-level request names no queue"
        );
        assert_eq!(got[2].azurite_operation, None, "not dispatched");
        assert_eq!(rest_operation("queue", "Blob_Download"), None);
    }
}
