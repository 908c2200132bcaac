//go:build ca135

// CA 1.35 and later: BuildExternalGrpc takes core/options.AutoscalerOptions, which wraps the
// config.AutoscalingOptions of config/flags.AutoscalingOptions().

package main

import (
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	"k8s.io/autoscaler/cluster-autoscaler/config/flags"
	cacontext "k8s.io/autoscaler/cluster-autoscaler/context"
	coreoptions "k8s.io/autoscaler/cluster-autoscaler/core/options"
)

// buildProvider builds CA's externalgrpc provider from cloudConfig as CA's main does (options
// from its flags, all at their defaults) and returns it with the NodeGroupDefaults CA's core
// passes to GetOptions.
func buildProvider(cloudConfig string) (cloudprovider.CloudProvider, config.NodeGroupAutoscalingOptions) {
	opts := &coreoptions.AutoscalerOptions{AutoscalingOptions: flags.AutoscalingOptions()}
	opts.CloudProviderName = cloudprovider.ExternalGrpcProviderName
	opts.CloudConfig = cloudConfig
	provider := externalgrpc.BuildExternalGrpc(opts, cloudprovider.NodeGroupDiscoveryOptions{},
		cacontext.NewResourceLimiterFromAutoscalingOptions(opts.AutoscalingOptions))
	return provider, opts.NodeGroupDefaults
}
