//go:build ca129

// CA 1.29-1.32: no config/flags package (the flags and createAutoscalingOptions live in CA's
// package main), and BuildExternalGrpc takes config.AutoscalingOptions.

package main

import (
	"time"

	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	cacontext "k8s.io/autoscaler/cluster-autoscaler/context"
	"k8s.io/autoscaler/cluster-autoscaler/utils/units"
)

// buildProvider builds CA's externalgrpc provider from cloudConfig as CA's main does and returns
// it with the NodeGroupDefaults CA's core passes to GetOptions. The options are those
// createAutoscalingOptions in CA 1.29-1.32's main.go makes from its flag defaults
// (--scale-down-utilization-threshold, --scale-down-gpu-utilization-threshold,
// --scale-down-unneeded-time, --scale-down-unready-time from config's Default* constants,
// --max-node-provision-time 15m, --ignore-daemonsets-utilization false, --cores-total and
// --memory-total 0:DefaultMaxClusterCores and 0:DefaultMaxClusterMemory GiB).
func buildProvider(cloudConfig string) (cloudprovider.CloudProvider, config.NodeGroupAutoscalingOptions) {
	opts := config.AutoscalingOptions{
		NodeGroupDefaults: config.NodeGroupAutoscalingOptions{
			ScaleDownUtilizationThreshold:    config.DefaultScaleDownUtilizationThreshold,
			ScaleDownGpuUtilizationThreshold: config.DefaultScaleDownGpuUtilizationThreshold,
			ScaleDownUnneededTime:            config.DefaultScaleDownUnneededTime,
			ScaleDownUnreadyTime:             config.DefaultScaleDownUnreadyTime,
			IgnoreDaemonSetsUtilization:      false,
			MaxNodeProvisionTime:             15 * time.Minute,
		},
		MaxCoresTotal:     config.DefaultMaxClusterCores,
		MaxMemoryTotal:    config.DefaultMaxClusterMemory * units.GiB,
		CloudConfig:       cloudConfig,
		CloudProviderName: cloudprovider.ExternalGrpcProviderName,
	}
	provider := externalgrpc.BuildExternalGrpc(opts, cloudprovider.NodeGroupDiscoveryOptions{},
		cacontext.NewResourceLimiterFromAutoscalingOptions(opts))
	return provider, opts.NodeGroupDefaults
}
