// clusterapi-diff asks two cluster-autoscaler cloud providers the same questions over the same
// Cluster API objects and prints both sets of answers as one JSON document:
//
//   - "intree": CA's own cloudprovider/clusterapi package (CA_VERSION's source, unmodified),
//     registered as cloudprovider/router registers it and built by CA's
//     cloudprovider/builder.NewCloudProvider from CA's own flags, as CA's main
//     builds it for --cloud-provider=clusterapi: --kubeconfig names the management (and
//     workload) cluster, --node-group-auto-discovery the specs (repeatable);
//   - "operator": CA's own cloudprovider/externalgrpc client, built the same way for
//     --cloud-provider=externalgrpc from --externalgrpc-cloud-config (address, cert, key,
//     cacert, grpc_timeout), talking to nodegroup-operator.
//
// For each side, after Refresh: every group NodeGroups() lists, with MinSize, MaxSize,
// TargetSize, Nodes (id, state, error class and code), TemplateNodeInfo (labels, taints,
// capacity, allocatable, the CPU requested by the NodeInfo's pods) and GetOptions (with the
// NodeGroupDefaults of CA's flags, the same for both), and NodeGroupForNode for every Node whose
// name starts with --node-prefix (the same Node objects, read once, for both sides: the group's
// id, min and max, or null). "defaults" is what both got as CA's default options.
//
// Only what is necessarily different is normalized: the template node's name (random in-tree)
// is replaced in its kubernetes.io/hostname label by "<template node name>", instances are
// sorted by id, and an error is reported as its text, whether it is CA's ErrNotImplemented and
// its gRPC code (the texts differ by construction; tests compare whether there is an error and
// of which kind). Exit status: 0 with the document on stdout, 2 on a usage or setup error.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	cloudBuilder "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/builder"
	// What cloudprovider/router's router_clusterapi.go and router_externalgrpc.go import
	// (CA built with -tags externalgrpc,clusterapi): each provider registers its builder.
	_ "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/clusterapi"
	_ "k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	"k8s.io/autoscaler/cluster-autoscaler/config/flags"
	coreoptions "k8s.io/autoscaler/cluster-autoscaler/core/options"
	ca_processors "k8s.io/autoscaler/cluster-autoscaler/processors"
	"k8s.io/autoscaler/cluster-autoscaler/processors/scaledowncandidates"
	"k8s.io/autoscaler/cluster-autoscaler/simulator/framework"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

const templateNodeName = "<template node name>"

// errorView is an error as CA's core can tell errors apart.
type errorView struct {
	Message string `json:"message"`
	// CA's cloudprovider.ErrNotImplemented: CA falls back (no template, its default options).
	NotImplemented bool `json:"notImplemented"`
	// The gRPC status code, when the error carries one (the externalgrpc side).
	Code string `json:"code,omitempty"`
}

// answer is one method's return value, or its error.
type answer struct {
	Value any        `json:"value"`
	Error *errorView `json:"error,omitempty"`
}

func answerOf(value any, err error) answer {
	if err == nil {
		return answer{Value: value}
	}
	e := &errorView{Message: err.Error(), NotImplemented: errors.Is(err, cloudprovider.ErrNotImplemented)}
	if st, ok := status.FromError(err); ok && !e.NotImplemented {
		e.Code = st.Code().String()
	}
	return answer{Error: e}
}

type instance struct {
	ID string `json:"id"`
	// Running, Creating, Deleting, or "" for a nil status.
	State      string `json:"state"`
	ErrorClass string `json:"errorClass,omitempty"`
	ErrorCode  string `json:"errorCode,omitempty"`
}

type template struct {
	Labels      map[string]string `json:"labels"`
	Taints      []apiv1.Taint     `json:"taints"`
	Capacity    map[string]string `json:"capacity"`
	Allocatable map[string]string `json:"allocatable"`
	// The CPU requested by the pods the NodeInfo starts with (in-tree: kube-proxy's), millicores.
	PodsMilliCPU int64 `json:"podsMilliCPU"`
}

type group struct {
	ID         string `json:"id"`
	Min        int    `json:"min"`
	Max        int    `json:"max"`
	TargetSize answer `json:"targetSize"`
	Nodes      answer `json:"nodes"`
	Template   answer `json:"template"`
	Options    answer `json:"options"`
}

type side struct {
	Groups           []group           `json:"groups"`
	NodeGroupForNode map[string]answer `json:"nodeGroupForNode"`
	// Refresh's error, if any.
	Refresh *errorView `json:"refresh,omitempty"`
}

func main() {
	// CA's own flags (config/flags registers them on the global set), as CA's main parses them.
	klog.InitFlags(nil)
	grpcConfig := flag.String("externalgrpc-cloud-config", "", "the operator's externalgrpc cloud-config (address, cert, key, cacert, grpc_timeout)")
	nodePrefix := flag.String("node-prefix", "", "NodeGroupForNode is asked for every Node whose name starts with this")
	flag.Parse()
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "clusterapi-diff: "+format+"\n", a...)
		os.Exit(2)
	}
	caOptions := flags.AutoscalingOptions()
	if caOptions.KubeClientOpts.KubeConfigPath == "" || *grpcConfig == "" || *nodePrefix == "" {
		fail("usage: --kubeconfig FILE --node-group-auto-discovery clusterapi:... --externalgrpc-cloud-config FILE --node-prefix PREFIX")
	}

	nodes, err := listNodes(caOptions.KubeClientOpts.KubeConfigPath, *nodePrefix)
	if err != nil {
		fail("listing Nodes: %v", err)
	}
	defaults := caOptions.NodeGroupDefaults

	intree := build(caOptions, cloudprovider.ClusterAPIProviderName, "")
	operator := build(caOptions, cloudprovider.ExternalGrpcProviderName, *grpcConfig)
	out := map[string]any{
		"intree":   ask(intree, nodes, defaults),
		"operator": ask(operator, nodes, defaults),
		"defaults": viewOptions(defaults),
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", " ")
	if err := enc.Encode(out); err != nil {
		fail("writing the answers: %v", err)
	}
}

// build makes a provider as CA's main does (builder/autoscaler.go and core/autoscaler.go): the
// options of its flags, the default processors with the combined scale-down candidates
// processor the clusterapi provider registers into, and cloudprovider/builder.NewCloudProvider.
func build(base config.AutoscalingOptions, name, cloudConfig string) cloudprovider.CloudProvider {
	opts := &coreoptions.AutoscalerOptions{AutoscalingOptions: base}
	opts.CloudProviderName = name
	opts.CloudConfig = cloudConfig
	opts.Processors = ca_processors.DefaultProcessors(opts.AutoscalingOptions)
	opts.Processors.ScaleDownNodeProcessor = scaledowncandidates.NewCombinedScaleDownCandidatesProcessor()
	return cloudBuilder.NewCloudProvider(opts, nil)
}

func listNodes(kubeconfig, prefix string) ([]*apiv1.Node, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []*apiv1.Node
	for i := range list.Items {
		if strings.HasPrefix(list.Items[i].Name, prefix) {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

func ask(p cloudprovider.CloudProvider, nodes []*apiv1.Node, defaults config.NodeGroupAutoscalingOptions) side {
	s := side{NodeGroupForNode: map[string]answer{}, Groups: []group{}}
	if err := p.Refresh(); err != nil {
		s.Refresh = answerOf(nil, err).Error
	}
	for _, ng := range p.NodeGroups() {
		g := group{ID: ng.Id(), Min: ng.MinSize(), Max: ng.MaxSize()}
		g.TargetSize = answerOf(ng.TargetSize())
		instances, err := ng.Nodes()
		g.Nodes = answerOf(viewInstances(instances), err)
		info, err := ng.TemplateNodeInfo()
		if err != nil || info == nil {
			g.Template = answerOf(nil, err)
		} else {
			g.Template = answer{Value: viewTemplate(info.Node(), info.Pods())}
		}
		opts, err := ng.GetOptions(defaults)
		if err != nil || opts == nil {
			g.Options = answerOf(nil, err)
		} else {
			g.Options = answer{Value: viewOptions(*opts)}
		}
		s.Groups = append(s.Groups, g)
	}
	sort.Slice(s.Groups, func(i, j int) bool { return s.Groups[i].ID < s.Groups[j].ID })
	for _, node := range nodes {
		ng, err := p.NodeGroupForNode(node)
		var view any
		if err == nil && ng != nil && !isNil(ng) {
			view = map[string]any{"id": ng.Id(), "min": ng.MinSize(), "max": ng.MaxSize()}
		}
		s.NodeGroupForNode[node.Name] = answerOf(view, err)
	}
	return s
}

// isNil: a typed nil NodeGroup in the interface (CA's core checks reflect.ValueOf(ng).IsNil()).
func isNil(ng cloudprovider.NodeGroup) bool {
	v := reflect.ValueOf(ng)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func viewInstances(instances []cloudprovider.Instance) []instance {
	out := make([]instance, 0, len(instances))
	for _, i := range instances {
		v := instance{ID: i.Id}
		if i.Status != nil {
			switch i.Status.State {
			case cloudprovider.InstanceRunning:
				v.State = "Running"
			case cloudprovider.InstanceCreating:
				v.State = "Creating"
			case cloudprovider.InstanceDeleting:
				v.State = "Deleting"
			default:
				v.State = fmt.Sprintf("state %d", i.Status.State)
			}
			if e := i.Status.ErrorInfo; e != nil {
				v.ErrorClass = e.ErrorClass.String()
				v.ErrorCode = e.ErrorCode
			}
		}
		out = append(out, v)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

func viewTemplate(n *apiv1.Node, pods []*framework.PodInfo) template {
	t := template{
		Labels:      map[string]string{},
		Taints:      n.Spec.Taints,
		Capacity:    quantities(n.Status.Capacity),
		Allocatable: quantities(n.Status.Allocatable),
	}
	for k, v := range n.Labels {
		if k == apiv1.LabelHostname && v == n.Name {
			v = templateNodeName
		}
		t.Labels[k] = v
	}
	if t.Taints == nil {
		t.Taints = []apiv1.Taint{}
	}
	for _, p := range pods {
		for _, c := range p.Pod.Spec.Containers {
			if q, ok := c.Resources.Requests[apiv1.ResourceCPU]; ok {
				t.PodsMilliCPU += q.MilliValue()
			}
		}
	}
	return t
}

func quantities(list apiv1.ResourceList) map[string]string {
	out := map[string]string{}
	for k, v := range list {
		out[string(k)] = v.String()
	}
	return out
}

type options struct {
	ScaleDownUtilizationThreshold    float64 `json:"scaleDownUtilizationThreshold"`
	ScaleDownGpuUtilizationThreshold float64 `json:"scaleDownGpuUtilizationThreshold"`
	ScaleDownUnneededTime            string  `json:"scaleDownUnneededTime"`
	ScaleDownUnreadyTime             string  `json:"scaleDownUnreadyTime"`
	MaxNodeProvisionTime             string  `json:"maxNodeProvisionTime"`
	MaxNodeStartupTime               string  `json:"maxNodeStartupTime"`
	ZeroOrMaxNodeScaling             bool    `json:"zeroOrMaxNodeScaling"`
	AllowNonAtomicScaleUpToMax       bool    `json:"allowNonAtomicScaleUpToMax"`
	IgnoreDaemonSetsUtilization      bool    `json:"ignoreDaemonSetsUtilization"`
}

func viewOptions(o config.NodeGroupAutoscalingOptions) options {
	return options{
		ScaleDownUtilizationThreshold:    o.ScaleDownUtilizationThreshold,
		ScaleDownGpuUtilizationThreshold: o.ScaleDownGpuUtilizationThreshold,
		ScaleDownUnneededTime:            o.ScaleDownUnneededTime.String(),
		ScaleDownUnreadyTime:             o.ScaleDownUnreadyTime.String(),
		MaxNodeProvisionTime:             o.MaxNodeProvisionTime.String(),
		MaxNodeStartupTime:               o.MaxNodeStartupTime.String(),
		ZeroOrMaxNodeScaling:             o.ZeroOrMaxNodeScaling,
		AllowNonAtomicScaleUpToMax:       o.AllowNonAtomicScaleUpToMax,
		IgnoreDaemonSetsUtilization:      o.IgnoreDaemonSetsUtilization,
	}
}
