// Autoscale of the regular lane's scale set (docs/deploying.md, "The two lanes"): from zero, a VM
// per job on the regular lane's queue, and one VM to keep the lanes while no
// Spot VM runs. Why it is built this way (sources and what is unverified in
// bicep/README.md, "The regular lane's autoscale"):
//
// - Out, from zero: any message on the regular queue (the total, not
//   divided) -> "increase count to 1". It never adds more, so it holds
//   however Azure reads a per-instance metric at zero instances.
// - Out, on the regular queue: ApproximateMessageCount per instance >= 1
//   (one job per regular VM: their workers run SPOT_WORKER_CONCURRENCY=1):
//   the pool grows while every VM has a job, and holds one VM more than it
//   has jobs.
// - Out, to keep the lanes: when no VM of the Spot scale set has reported a
//   Percentage CPU sample for keeperWakeMinutes (no Spot capacity at all:
//   the Spot autoscale's minimum is 1 or more), "increase count to 1": one
//   regular VM, whose lane keeper moves the jobs waiting in the Spot lane
//   behind their line to the regular lane. A scale set without VMs read as
//   missing data rather than a count of zero gives the same VM (default 1).
// - In, straight to zero, only when both hold for 15 minutes: the regular
//   queue held nothing, and Spot VMs ran (so the keeper's VM stays while
//   Spot is away, and does not flap). Azure scales in only when every
//   scale-in rule fires. A regular VM gets a Terminate notification
//   (modules/compute.bicep), so its worker drains even then.
//
// tools/infra/regular_autoscale.py renders these rules and checks them on a
// table of cases under each reading above.

param location string
param name string
param vmssId string

@description('Resource id of the regular queue\'s metrics: <storage account id>/services/queue/queues/<queue>.')
param queueMetricsId string

@description('Resource id of the Spot lane\'s scale set, whose VMs\' Percentage CPU samples show whether any Spot VM runs.')
param spotVmssId string

@description('Fewest regular VMs: 0, or 1 to keep one always (it keeps the lanes whatever Azure reads; see bicep/README.md).')
@minValue(0)
param minInstances int

@minValue(1)
param maxInstances int

@description('Regular VMs added per scale-out.')
@minValue(1)
param scaleOutStep int

@description('Minutes without any Spot VM running before one regular VM is woken to keep the lanes (Azure takes a metric window of 5 minutes to 12 hours).')
@minValue(5)
@maxValue(720)
param keeperWakeMinutes int

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
        name: 'regular-lane'
        capacity: {
          minimum: string(minInstances)
          maximum: string(maxInstances)
          // Used only when metrics are missing, and only if the scale set has
          // fewer: one VM to keep the lanes if Azure reads a Spot scale set
          // without VMs as missing data.
          default: '1'
        }
        rules: [
          {
            // From zero: any job in the regular lane wakes one VM.
            metricTrigger: {
              metricName: 'ApproximateMessageCount'
              metricNamespace: ''
              metricResourceUri: queueMetricsId
              timeGrain: 'PT1M'
              statistic: 'Max'
              timeWindow: 'PT5M'
              timeAggregation: 'Maximum'
              operator: 'GreaterThanOrEqual'
              threshold: 1
              dividePerInstance: false
            }
            scaleAction: {
              // "Increase count to 1": never more than one, never fewer than
              // run.
              direction: 'Increase'
              type: 'ExactCount'
              value: '1'
              cooldown: 'PT2M'
            }
          }
          {
            // Then a VM per job.
            metricTrigger: {
              metricName: 'ApproximateMessageCount'
              metricNamespace: ''
              metricResourceUri: queueMetricsId
              timeGrain: 'PT1M'
              statistic: 'Max'
              timeWindow: 'PT5M'
              timeAggregation: 'Maximum'
              operator: 'GreaterThanOrEqual'
              threshold: 1
              dividePerInstance: true
            }
            scaleAction: {
              direction: 'Increase'
              type: 'ChangeCount'
              value: string(scaleOutStep)
              cooldown: 'PT2M'
            }
          }
          {
            metricTrigger: {
              metricName: 'Percentage CPU'
              metricNamespace: 'microsoft.compute/virtualmachinescalesets'
              metricResourceUri: spotVmssId
              timeGrain: 'PT1M'
              statistic: 'Count'
              timeWindow: 'PT${keeperWakeMinutes}M'
              timeAggregation: 'Maximum'
              operator: 'LessThan'
              threshold: 1
              dividePerInstance: false
            }
            scaleAction: {
              // "Increase count to 1": never more than the one VM, never
              // fewer than run.
              direction: 'Increase'
              type: 'ExactCount'
              value: '1'
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
              timeWindow: 'PT15M'
              timeAggregation: 'Maximum'
              operator: 'LessThanOrEqual'
              threshold: 0
              dividePerInstance: false
            }
            scaleAction: {
              // Nothing in the regular lane for 15 minutes: down to zero (a
              // scale action's value must be 1 or more, so by the maximum).
              direction: 'Decrease'
              type: 'ChangeCount'
              value: string(maxInstances)
              cooldown: 'PT10M'
            }
          }
          {
            // ... and Spot VMs ran all along: the keeper's VM stays while
            // Spot is away.
            metricTrigger: {
              metricName: 'Percentage CPU'
              metricNamespace: 'microsoft.compute/virtualmachinescalesets'
              metricResourceUri: spotVmssId
              timeGrain: 'PT1M'
              statistic: 'Count'
              timeWindow: 'PT15M'
              timeAggregation: 'Minimum'
              operator: 'GreaterThanOrEqual'
              threshold: 1
              dividePerInstance: false
            }
            scaleAction: {
              direction: 'Decrease'
              type: 'ChangeCount'
              value: string(maxInstances)
              cooldown: 'PT10M'
            }
          }
        ]
      }
    ]
  }
}

output id string = autoscale.id
