//go:build ca133

// CA 1.33-1.34: config/flags.AutoscalingOptions() has CA's flag defaults, and BuildExternalGrpc
// still takes config.AutoscalingOptions.

package main

import (
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	"k8s.io/autoscaler/cluster-autoscaler/config/flags"
	cacontext "k8s.io/autoscaler/cluster-autoscaler/context"
)

// buildProvider builds CA's externalgrpc provider from cloudConfig as CA's main does (options
// from its flags, all at their defaults) and returns it with the NodeGroupDefaults CA's core
// passes to GetOptions.
func buildProvider(cloudConfig string) (cloudprovider.CloudProvider, config.NodeGroupAutoscalingOptions) {
	opts := flags.AutoscalingOptions()
	opts.CloudProviderName = cloudprovider.ExternalGrpcProviderName
	opts.CloudConfig = cloudConfig
	provider := externalgrpc.BuildExternalGrpc(opts, cloudprovider.NodeGroupDiscoveryOptions{},
		cacontext.NewResourceLimiterFromAutoscalingOptions(opts))
	return provider, opts.NodeGroupDefaults
}
