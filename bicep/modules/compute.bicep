// The workers: a Flexible-orchestration scale set of Spot VMs (eviction policy
// Delete, several VM sizes), Ubuntu with SSH keys only and no public IP, the
// Application Health extension probing the worker's liveness (/healthz) with
// automatic repairs, Scheduled Events published for user reboots and
// redeploys, and cloud-init installing the worker as a systemd service.
//
// The same module deploys the regular lane's scale set (docs/deploying.md, "The two lanes") with
// priority Regular: the same image, identity and worker, serving the regular
// lane's queue (SPOT_WORKER_LANE=regular), one job per VM, and a terminate
// notification, so that a scale-in drains its worker like an eviction does.

param location string
param namePrefix string

@description('Spot: the Spot lane\'s scale set (the workers of SPOT_WORKER_QUEUE). Regular: the regular lane\'s, regular-priority VMs serving SPOT_WORKER_REGULAR_QUEUE (docs/deploying.md, "The two lanes").')
@allowed([
  'Spot'
  'Regular'
])
param priority string

@description('The lane these workers serve (SPOT_WORKER_LANE): spot or regular, as priority.')
@allowed([
  'spot'
  'regular'
])
param lane string

@description('The regular lane\'s queue (SPOT_WORKER_REGULAR_QUEUE); empty: no lanes.')
param regularQueueName string

@description('Messages a worker handles at once (SPOT_WORKER_CONCURRENCY); empty: one per CPU. The regular lane runs one job per VM: its autoscale adds a VM per job waiting.')
param concurrency string

@description('VM sizes the scale set may use (instance mix, up to five); any of them must run the worker, and all must have the same local (temp) disk configuration, architecture, storage interface and security profile.')
@minLength(1)
@maxLength(5)
param vmSizes array

// API 2024-07-01 knows only these two; Prioritized (a preview) came later.
@description('How the platform picks among vmSizes.')
@allowed([
  'LowestPrice'
  'CapacityOptimized'
])
param allocationStrategy string

@description('Highest price per hour in USD a VM may cost before it is evicted; -1 = up to the pay-as-you-go price (evicted for capacity only).')
param maxPrice string

@description('Instances the deployment sets (sku.capacity). On a re-deploy this must be the count the scale set has now (deploy.sh reads it), or the deployment would delete running Spot workers without notice; autoscale takes over from there.')
@minValue(0)
param instanceCount int

@description('Also publish Scheduled Events to Event Grid and Resource Graph: a preview behind a subscription feature flag, so off unless asked for (deploy.sh explains).')
param publishScheduledEventsToEventGrid bool

param adminUsername string

@description('SSH public key for adminUsername (there is no password).')
param sshPublicKey string

param subnetId string
param nsgId string
param identityId string
param identityClientId string
param storageBlobEndpoint string
param queueName string
param checkpointContainer string
param resultsContainer string
param workerBinaryUrl string

@description('SHA-256 of the worker binary (hex); the VM refuses a binary that does not match.')
param workerBinarySha256 string

@description('What ExecStart runs after the worker binary: empty (the binary is the worker), or `run [flags] -- <command>` (the spot-worker command runs the program per message). `%` and `$` are escaped here, so systemd takes them literally.')
param workerArgs string

@description('URL of the application bundle (.tar.gz) unpacked into /opt/spot-worker/app before the worker starts; empty = none.')
param workerBundleUrl string

@description('SHA-256 (hex) of the bundle; the VM refuses a bundle that does not match.')
param workerBundleSha256 string

@description('SPOT_WORKER_SCALE_IN_PROTECTION: on, the worker protects its own VM from scale-in while it holds work (main.bicep\'s scaleInProtection, which also deploys the role it needs and the prompt scale-in rule); off, it does not.')
@allowed([
  'on'
  'off'
])
param scaleInProtection string

param appInsightsConnectionString string
param tags object

// The files cloud-init writes, filled in. tests/it/deploy.rs and
// tools/infra/check_infra.py fill the same {{placeholders}}.
var envTemplate = loadTextContent('../cloud-init/worker.env')
var env1 = replace(envTemplate, '{{storageAccountUrl}}', storageBlobEndpoint)
var env2 = replace(env1, '{{clientId}}', identityClientId)
var env3 = replace(env2, '{{queueName}}', queueName)
var env4 = replace(env3, '{{checkpointContainer}}', checkpointContainer)
var env5 = replace(env4, '{{resultsContainer}}', resultsContainer)
var env6 = replace(env5, '{{lane}}', lane)
var env7 = replace(env6, '{{regularQueueName}}', regularQueueName)
var env8 = replace(env7, '{{concurrency}}', concurrency)
var env9 = replace(env8, '{{scaleInProtection}}', scaleInProtection)
var workerEnv = replace(env9, '{{appInsightsConnectionString}}', appInsightsConnectionString)
var unitTemplate = loadTextContent('../cloud-init/spot-worker.service')
// systemd expands `%x` specifiers and `$VAR` in ExecStart: doubled, both are
// literal, so the command runs as written.
var workerArgs1 = replace(workerArgs, '%', '%%')
var workerArgsEscaped = replace(workerArgs1, '$', '$$')
var workerUnit = replace(unitTemplate, '{{workerArgs}}', workerArgsEscaped)
var installTemplate = loadTextContent('../cloud-init/install-worker.sh')
var install1 = replace(installTemplate, '{{workerBinaryUrl}}', workerBinaryUrl)
var install2 = replace(install1, '{{workerBinarySha256}}', workerBinarySha256)
var install3 = replace(install2, '{{workerBundleUrl}}', workerBundleUrl)
var install4 = replace(install3, '{{workerBundleSha256}}', workerBundleSha256)
var installScript = replace(install4, '{{clientId}}', identityClientId)
var cloudInitTemplate = loadTextContent('../cloud-init/cloud-init.yaml')
var cloudInit1 = replace(cloudInitTemplate, '{{workerEnvB64}}', base64(workerEnv))
var cloudInit2 = replace(cloudInit1, '{{workerUnitB64}}', base64(workerUnit))
var cloudInit = replace(cloudInit2, '{{installScriptB64}}', base64(installScript))

// Automatic repairs replace a VM whose worker is not alive: the health
// extension probes the liveness path (/healthz), which answers 200 while the
// process and its runtime answer. Never the readiness path (/readyz): it
// answers 503 for reasons every VM shares, such as storage refusing or out of
// reach, Entra ID or IMDS down, or the worker parked for a shared event. A
// replacement would fail the same way, and repairs would replace VM after VM
// into the same outage. The grace period counts from the last state change of
// a VM, a PUT, PATCH or POST on the scale set such as its creation, a reimage
// or an update, not from when it became unhealthy (Azure, "Automatic instance
// repairs for Azure Virtual Machine Scale Sets"): it covers boot, cloud-init
// and the binary download. tools/infra/health_probe.py checks the probe path.
resource vmss 'Microsoft.Compute/virtualMachineScaleSets@2024-07-01' = {
  //checkov:skip=CKV_AZURE_95:No automatic OS image upgrades: they reimage running workers without a Scheduled Event. Spot VMs with eviction policy Delete are short-lived and every new one boots imageReference version 'latest'; Ubuntu's unattended-upgrades (patchMode ImageDefault) applies security updates meanwhile.
  name: priority == 'Spot' ? '${namePrefix}-vmss' : '${namePrefix}-regular-vmss'
  location: location
  tags: tags
  identity: {
    type: 'UserAssigned'
    userAssignedIdentities: {
      '${identityId}': {}
    }
  }
  sku: {
    // Instance mix: the sizes are in skuProfile.
    name: 'Mix'
    capacity: instanceCount
  }
  properties: {
    orchestrationMode: 'Flexible'
    platformFaultDomainCount: 1
    singlePlacementGroup: false
    skuProfile: {
      vmSizes: [for size in vmSizes: {
        name: size
      }]
      allocationStrategy: allocationStrategy
    }
    // Replaces a VM whose worker is not alive (the liveness probe below);
    // the grace period counts from a VM's last state change, not from when
    // it became unhealthy. Why: the comment above this resource.
    automaticRepairsPolicy: {
      enabled: true
      gracePeriod: 'PT30M'
      repairAction: 'Replace'
    }
    // Scheduled Events: user reboots and redeploys are announced, not auto-
    // approved (the worker drains, then approves). Publishing every event to
    // Event Grid and Resource Graph too is a preview behind a feature flag: on
    // request.
    scheduledEventsPolicy: {
      userInitiatedReboot: {
        automaticallyApprove: false
      }
      userInitiatedRedeploy: {
        automaticallyApprove: false
      }
      // Left out (null) unless asked for: the setting itself is the preview.
      scheduledEventsAdditionalPublishingTargets: publishScheduledEventsToEventGrid ? {
        eventGridAndResourceGraph: {
          enable: true
        }
      } : null
    }
    upgradePolicy: {
      mode: 'Manual'
    }
    virtualMachineProfile: {
      priority: priority
      evictionPolicy: priority == 'Spot' ? 'Delete' : null
      billingProfile: priority == 'Spot' ? {
        maxPrice: json(maxPrice)
      } : null
      // A terminate notification for the regular VMs only (Spot has none):
      // an autoscale scale-in then posts a Terminate event, which the worker
      // drains on as on an eviction (its job goes back to its lane's queue,
      // or where the lane rule says), instead of being cut off.
      scheduledEventsProfile: priority == 'Spot' ? null : {
        terminateNotificationProfile: {
          enable: true
          notBeforeTimeout: 'PT5M'
        }
      }
      osProfile: {
        computerNamePrefix: priority == 'Spot' ? take(replace(namePrefix, '-', ''), 9) : '${take(replace(namePrefix, '-', ''), 8)}r'
        adminUsername: adminUsername
        customData: base64(cloudInit)
        allowExtensionOperations: true
        linuxConfiguration: {
          disablePasswordAuthentication: true
          provisionVMAgent: true
          ssh: {
            publicKeys: [
              {
                path: '/home/${adminUsername}/.ssh/authorized_keys'
                keyData: sshPublicKey
              }
            ]
          }
          patchSettings: {
            patchMode: 'ImageDefault'
            assessmentMode: 'ImageDefault'
          }
        }
      }
      storageProfile: {
        imageReference: {
          publisher: 'Canonical'
          offer: 'ubuntu-24_04-lts'
          sku: 'server'
          version: 'latest'
        }
        osDisk: {
          createOption: 'FromImage'
          caching: 'ReadWrite'
          deleteOption: 'Delete'
          diskSizeGB: 30
          managedDisk: {
            storageAccountType: 'StandardSSD_LRS'
          }
        }
      }
      securityProfile: {
        securityType: 'TrustedLaunch'
        uefiSettings: {
          secureBootEnabled: true
          vTpmEnabled: true
        }
        // Needs the subscription feature Microsoft.Compute/EncryptionAtHost:
        // scripts/deploy.sh checks it before deploying anything.
        encryptionAtHost: true
      }
      diagnosticsProfile: {
        // Managed boot diagnostics: the serial console log shows cloud-init.
        bootDiagnostics: {
          enabled: true
        }
      }
      networkProfile: {
        networkApiVersion: '2020-11-01'
        networkInterfaceConfigurations: [
          {
            name: 'nic'
            properties: {
              primary: true
              deleteOption: 'Delete'
              networkSecurityGroup: {
                id: nsgId
              }
              ipConfigurations: [
                {
                  name: 'ipconfig'
                  properties: {
                    primary: true
                    privateIPAddressVersion: 'IPv4'
                    subnet: {
                      id: subnetId
                    }
                    // No publicIPAddressConfiguration: no public IP, ever.
                  }
                }
              ]
            }
          }
        ]
      }
      extensionProfile: {
        extensions: [
          {
            name: 'health'
            properties: {
              publisher: 'Microsoft.ManagedServices'
              type: 'ApplicationHealthLinux'
              // 1.0: binary health (HTTP 200 = healthy). 2.0 would expect an
              // ApplicationHealthState field in the body, which /healthz
              // does not have.
              typeHandlerVersion: '1.0'
              autoUpgradeMinorVersion: true
              settings: {
                protocol: 'http'
                port: 8080
                // Liveness, never readiness: see automaticRepairsPolicy.
                requestPath: '/healthz'
              }
            }
          }
        ]
      }
    }
  }
}

output id string = vmss.id
output name string = vmss.name
