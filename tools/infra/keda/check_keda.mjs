// Validates KEDA objects against KEDA's own types (@kubernetes-models/keda,
// generated from KEDA's Go API): reads a JSON array of objects on stdin and
// prints a JSON array of findings, one string per problem (empty: all valid):
// schema violations, and properties no KEDA type declares (strict.mjs).
// Run by tools/infra/check_manifests.py.
import { unknownProperties } from "./strict.mjs";
import { ScaledObject, TriggerAuthentication, ScaledJob, ClusterTriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1";

const kinds = { ScaledObject, TriggerAuthentication, ScaledJob, ClusterTriggerAuthentication };

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const objects = JSON.parse(Buffer.concat(chunks).toString("utf8"));

const findings = [];
for (const object of objects) {
  const where = `${object.kind ?? "?"}/${object.metadata?.name ?? "?"}`;
  const Kind = kinds[object.kind];
  if (object.apiVersion !== "keda.sh/v1alpha1" || !Kind) {
    findings.push(`${where}: ${object.apiVersion}/${object.kind} is not a KEDA kind this check knows`);
    continue;
  }
  for (const problem of unknownProperties(object)) findings.push(`${where}: ${problem}`);
  try {
    new Kind(object).validate();
  } catch (error) {
    const details = (error.errors ?? []).map((e) => `${e.instancePath || "/"} ${e.message}${e.params ? " " + JSON.stringify(e.params) : ""}`);
    findings.push(`${where}: ${details.length ? details.join("; ") : error.message}`);
  }
}
process.stdout.write(JSON.stringify(findings));
