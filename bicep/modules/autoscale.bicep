// Autoscale on the job queue's length: out on backlog; in, with the
// workers' scale-in protection (scaleInProtection, the default), as soon as
// the queue holds less work than the fleet can take, a step at a time; in,
// without it, only when there is no work anywhere. Why it is built this way
// (sources in bicep/README.md, "Autoscale and scale-in"):
//
// - A Spot VM removed by scale-in gets no Scheduled Event (Spot has no
//   terminate notification), so its worker cannot drain: whatever it holds is
//   cut off. Autoscale picks which VM goes.
// - With scaleInProtection, every worker keeps its own VM protected from
//   scale-in (protectFromScaleIn) while it holds work and for its idle grace
//   after (SPOT_WORKER_SCALE_IN_PROTECTION=on, set in the same deployment by
//   modules/compute.bicep). Autoscale then picks only among idle VMs, so the
//   prompt rule may fire while jobs run: the average count per instance over
//   scaleInWindowMinutes below 1 (fewer messages, waiting or held, than
//   instances) -> scaleInStep fewer instances, at most every
//   scaleInCooldownMinutes, never below minInstances. A step, not straight
//   to the minimum: what Azure does when a scale-in asks for more VMs than
//   are unprotected is not documented, and a step bounds what a surprise
//   there can cost (bicep/README.md, "The prompt rule").
// - Without it, the only safe scale-in is one that happens when *no*
//   instance holds a message. ApproximateMessageCount counts every message
//   not yet deleted, the invisible (in-flight) ones included, and is never
//   lower than the real count. For the storage-queue metric Azure compares a
//   per-instance value (count / instances) with the threshold. A scale-in
//   rule "count < 1" would therefore fire with 3 messages in flight on 4
//   instances (3/4 < 1). "Maximum of the count over 15 minutes <= 0" is true
//   only when the count was 0 the whole time, whether or not it is divided
//   per instance.
// - Scale-out: when the backlog per instance exceeds backlogPerInstance.
//
// tools/infra/autoscale_model.py renders these rules (both settings of
// scaleInProtection) and checks them on a table of (backlog, in flight,
// busy, instances) cases under three readings of the per-instance division
// (once, by dividePerInstance only, or twice).

param location string
param name string
param vmssId string

@description('Resource id of the job queue\'s metrics: <storage account id>/services/queue/queues/<queue>.')
param queueMetricsId string

// At least 1: waking from zero would need the per-instance queue metric
// evaluated at zero instances, which Azure does not document (bicep/README.md).
@minValue(1)
param minInstances int

@minValue(1)
param maxInstances int

@description('Messages waiting per instance above which the scale set grows.')
@minValue(1)
param backlogPerInstance int

@description('Instances added per scale-out.')
@minValue(1)
param scaleOutStep int

@description('The workers protect their own VM from scale-in while they hold work (SPOT_WORKER_SCALE_IN_PROTECTION=on, set by the same parameter in main.bicep): the prompt scale-in rule. false: scale in only after the queue held nothing for 15 minutes.')
param scaleInProtection bool

@description('With scaleInProtection: the window (minutes, at least Azure\'s 5) over which the queue\'s average count per instance must stay below 1 before idle VMs go.')
@minValue(5)
@maxValue(60)
param scaleInWindowMinutes int

@description('With scaleInProtection: minutes after a scale-in before the next one.')
@minValue(1)
@maxValue(60)
param scaleInCooldownMinutes int

@description('With scaleInProtection: instances removed per scale-in, at most (only unprotected, idle ones go).')
@minValue(1)
param scaleInStep int

param tags object

var scaleOut = {
  metricTrigger: {
    metricName: 'ApproximateMessageCount'
    metricNamespace: ''
    metricResourceUri: queueMetricsId
    timeGrain: 'PT1M'
    statistic: 'Average'
    timeWindow: 'PT5M'
    timeAggregation: 'Average'
    operator: 'GreaterThan'
    threshold: backlogPerInstance
    dividePerInstance: true
  }
  scaleAction: {
    direction: 'Increase'
    type: 'ChangeCount'
    value: string(scaleOutStep)
    cooldown: 'PT5M'
  }
}

// With the workers' protection: fewer messages (waiting or held) than
// instances on average over the window -> a step of idle VMs goes. Only
// unprotected VMs are candidates, and a worker holding a message keeps its
// VM protected until it has been idle for its grace.
var promptScaleIn = {
  metricTrigger: {
    metricName: 'ApproximateMessageCount'
    metricNamespace: ''
    metricResourceUri: queueMetricsId
    timeGrain: 'PT1M'
    statistic: 'Average'
    timeWindow: 'PT${scaleInWindowMinutes}M'
    timeAggregation: 'Average'
    operator: 'LessThan'
    threshold: 1
    dividePerInstance: true
  }
  scaleAction: {
    direction: 'Decrease'
    type: 'ChangeCount'
    value: string(scaleInStep)
    cooldown: 'PT${scaleInCooldownMinutes}M'
  }
}

// Without it: nothing waiting or held anywhere for 15 minutes.
var emptyQueueScaleIn = {
  metricTrigger: {
    metricName: 'ApproximateMessageCount'
    metricNamespace: ''
    metricResourceUri: queueMetricsId
    timeGrain: 'PT1M'
    statistic: 'Max'
    // Longer than a job's lease renewal gap and the metric's delay,
    // so a single sample of 0 between two jobs does not count.
    timeWindow: 'PT15M'
    timeAggregation: 'Maximum'
    // <= 0, not < 1: with the count divided per instance, "< 1"
    // would also hold for fewer messages than instances.
    operator: 'LessThanOrEqual'
    threshold: 0
    dividePerInstance: false
  }
  scaleAction: {
    // Nothing held anywhere: straight down to the minimum.
    direction: 'Decrease'
    type: 'ExactCount'
    value: string(minInstances)
    cooldown: 'PT10M'
  }
}

resource autoscale 'Microsoft.Insights/autoscalesettings@2022-10-01' = {
  name: name
  location: location
  tags: tags
  properties: {
    enabled: true
    targetResourceUri: vmssId
    profiles: [
      {
        name: 'queue-backlog'
        capacity: {
          minimum: string(minInstances)
          maximum: string(maxInstances)
          // Used only when metrics are missing and only if the scale set has
          // fewer instances: it never scales in.
          default: string(minInstances)
        }
        rules: scaleInProtection ? [
          scaleOut
          promptScaleIn
        ] : [
          scaleOut
          emptyQueueScaleIn
        ]
      }
    ]
  }
}

output id string = autoscale.id
