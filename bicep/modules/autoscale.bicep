// Autoscale on the job queue's length: out on backlog, in only when there is
// no work anywhere. Why it is built this way (sources in bicep/README.md,
// "Autoscale and scale-in"):
//
// - A Spot VM removed by scale-in gets no Scheduled Event (Spot has no
//   terminate notification), so its worker cannot drain: whatever it holds is
//   cut off. Autoscale picks which VM goes, so the only safe scale-in is one
//   that happens when *no* instance holds a message.
// - ApproximateMessageCount counts every message not yet deleted, the
//   invisible (in-flight) ones included, and is never lower than the real
//   count. For the storage-queue metric Azure compares a per-instance value
//   (count / instances) with the threshold. A scale-in rule "count < 1" would
//   therefore fire with 3 messages in flight on 4 instances (3/4 < 1).
//   "Maximum of the count over 15 minutes <= 0" is true only when the count
//   was 0 the whole time, whether or not it is divided per instance.
// - Scale-out: when the backlog per instance exceeds backlogPerInstance.
//
// tools/infra/autoscale_model.py renders these rules and checks them on a
// table of (backlog, in flight, instances) cases under three readings of
// the per-instance division (once, by dividePerInstance only, or twice).

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

param tags object

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
        rules: [
          {
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
          {
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
        ]
      }
    ]
  }
}

output id string = autoscale.id
