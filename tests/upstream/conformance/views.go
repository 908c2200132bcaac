package main

// JSON views of what the scenario passes to CA and of what CA's methods return. They only
// translate types; every decision is CA's.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/config"
)

// node is a Node as CA's core would hold it: the fields CA's client sends to the server.
type node struct {
	ProviderID  string            `json:"providerID"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// apiNode is the Node CA's methods take; nil for a nil node (CA decides what that means).
func (n *node) apiNode() *apiv1.Node {
	if n == nil {
		return nil
	}
	return &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, Annotations: n.Annotations},
		Spec:       apiv1.NodeSpec{ProviderID: n.ProviderID},
	}
}

func apiNodes(nodes []node) []*apiv1.Node {
	out := make([]*apiv1.Node, len(nodes))
	for i := range nodes {
		out[i] = nodes[i].apiNode()
	}
	return out
}

// groupView is a NodeGroup as its cached getters describe it.
type groupView struct {
	ID      string `json:"id"`
	MinSize int    `json:"minSize"`
	MaxSize int    `json:"maxSize"`
	Debug   string `json:"debug"`
}

// viewGroup is nil for a nil group (NodeGroupForNode's "not managed by CA").
func viewGroup(ng cloudprovider.NodeGroup) *groupView {
	if ng == nil {
		return nil
	}
	return &groupView{ID: ng.Id(), MinSize: ng.MinSize(), MaxSize: ng.MaxSize(), Debug: ng.Debug()}
}

func groupViews(groups []cloudprovider.NodeGroup) []*groupView {
	out := make([]*groupView, len(groups))
	for i, ng := range groups {
		out[i] = viewGroup(ng)
	}
	return out
}

// instanceView is a cloudprovider.Instance; Status is nil when CA has none for it.
type instanceView struct {
	ID     string      `json:"id"`
	Status *statusView `json:"status"`
}

type statusView struct {
	State     string         `json:"state"`
	ErrorInfo *errorInfoView `json:"errorInfo"`
}

type errorInfoView struct {
	Class   string `json:"class"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

var instanceStates = map[cloudprovider.InstanceState]string{
	cloudprovider.InstanceRunning:  "Running",
	cloudprovider.InstanceCreating: "Creating",
	cloudprovider.InstanceDeleting: "Deleting",
}

// instanceViews keeps nil distinct from empty: CA returns nil instances with an error.
func instanceViews(instances []cloudprovider.Instance) []instanceView {
	if instances == nil {
		return nil
	}
	out := make([]instanceView, len(instances))
	for i, in := range instances {
		out[i].ID = in.Id
		if in.Status == nil {
			continue
		}
		state, ok := instanceStates[in.Status.State]
		if !ok {
			state = fmt.Sprintf("InstanceState(%d)", in.Status.State)
		}
		out[i].Status = &statusView{State: state}
		if e := in.Status.ErrorInfo; e != nil {
			out[i].Status.ErrorInfo = &errorInfoView{Class: e.ErrorClass.String(), Code: e.ErrorCode, Message: e.ErrorMessage}
		}
	}
	return out
}

// nodeView is the part of a template Node that CA's scale-up simulation reads.
type nodeView struct {
	Name        string                `json:"name"`
	Labels      map[string]string     `json:"labels"`
	Annotations map[string]string     `json:"annotations"`
	Taints      []apiv1.Taint         `json:"taints"`
	Capacity    apiv1.ResourceList    `json:"capacity"`
	Allocatable apiv1.ResourceList    `json:"allocatable"`
	Conditions  []apiv1.NodeCondition `json:"conditions"`
}

func viewNode(n *apiv1.Node) *nodeView {
	if n == nil {
		return nil
	}
	return &nodeView{
		Name:        n.Name,
		Labels:      n.Labels,
		Annotations: n.Annotations,
		Taints:      n.Spec.Taints,
		Capacity:    n.Status.Capacity,
		Allocatable: n.Status.Allocatable,
		Conditions:  n.Status.Conditions,
	}
}

// options is config.NodeGroupAutoscalingOptions with durations as Go duration strings; the
// scenario's GetOptions defaults override its fields by these names. The pointer fields exist
// only in some CA releases' config (MaxNodeStartupTime from 1.35, AllowNonAtomicScaleUpToMax
// from 1.34): nil, and left out of the JSON, where the release has no such field.
type options struct {
	ScaleDownUtilizationThreshold    float64   `json:"scaleDownUtilizationThreshold"`
	ScaleDownGpuUtilizationThreshold float64   `json:"scaleDownGpuUtilizationThreshold"`
	ScaleDownUnneededTime            duration  `json:"scaleDownUnneededTime"`
	ScaleDownUnreadyTime             duration  `json:"scaleDownUnreadyTime"`
	MaxNodeProvisionTime             duration  `json:"maxNodeProvisionTime"`
	MaxNodeStartupTime               *duration `json:"maxNodeStartupTime,omitempty"`
	ZeroOrMaxNodeScaling             bool      `json:"zeroOrMaxNodeScaling"`
	AllowNonAtomicScaleUpToMax       *bool     `json:"allowNonAtomicScaleUpToMax,omitempty"`
	IgnoreDaemonSetsUtilization      bool      `json:"ignoreDaemonSetsUtilization"`
}

// optionalField is the field of o named name, if this CA release's config has it. Fields that
// only some releases have are reached by name so that one views.go builds against all of them.
func optionalField(o *config.NodeGroupAutoscalingOptions, name string) (reflect.Value, bool) {
	f := reflect.ValueOf(o).Elem().FieldByName(name)
	return f, f.IsValid()
}

func viewOptions(o config.NodeGroupAutoscalingOptions) options {
	v := options{
		ScaleDownUtilizationThreshold:    o.ScaleDownUtilizationThreshold,
		ScaleDownGpuUtilizationThreshold: o.ScaleDownGpuUtilizationThreshold,
		ScaleDownUnneededTime:            duration(o.ScaleDownUnneededTime),
		ScaleDownUnreadyTime:             duration(o.ScaleDownUnreadyTime),
		MaxNodeProvisionTime:             duration(o.MaxNodeProvisionTime),
		ZeroOrMaxNodeScaling:             o.ZeroOrMaxNodeScaling,
		IgnoreDaemonSetsUtilization:      o.IgnoreDaemonSetsUtilization,
	}
	if f, ok := optionalField(&o, "MaxNodeStartupTime"); ok {
		d := duration(time.Duration(f.Int()))
		v.MaxNodeStartupTime = &d
	}
	if f, ok := optionalField(&o, "AllowNonAtomicScaleUpToMax"); ok {
		b := f.Bool()
		v.AllowNonAtomicScaleUpToMax = &b
	}
	return v
}

// config is the NodeGroupAutoscalingOptions CA's core would pass; an error (unsupported) when
// o sets a field this release's config does not have.
func (o options) config() (config.NodeGroupAutoscalingOptions, error) {
	c := config.NodeGroupAutoscalingOptions{
		ScaleDownUtilizationThreshold:    o.ScaleDownUtilizationThreshold,
		ScaleDownGpuUtilizationThreshold: o.ScaleDownGpuUtilizationThreshold,
		ScaleDownUnneededTime:            time.Duration(o.ScaleDownUnneededTime),
		ScaleDownUnreadyTime:             time.Duration(o.ScaleDownUnreadyTime),
		MaxNodeProvisionTime:             time.Duration(o.MaxNodeProvisionTime),
		ZeroOrMaxNodeScaling:             o.ZeroOrMaxNodeScaling,
		IgnoreDaemonSetsUtilization:      o.IgnoreDaemonSetsUtilization,
	}
	if o.MaxNodeStartupTime != nil {
		f, ok := optionalField(&c, "MaxNodeStartupTime")
		if !ok {
			return c, unsupported{"NodeGroupAutoscalingOptions.MaxNodeStartupTime"}
		}
		f.SetInt(int64(*o.MaxNodeStartupTime))
	}
	if o.AllowNonAtomicScaleUpToMax != nil {
		f, ok := optionalField(&c, "AllowNonAtomicScaleUpToMax")
		if !ok {
			return c, unsupported{"NodeGroupAutoscalingOptions.AllowNonAtomicScaleUpToMax"}
		}
		f.SetBool(*o.AllowNonAtomicScaleUpToMax)
	}
	return c, nil
}

// duration is a time.Duration in JSON as a Go duration string ("10m0s").
type duration time.Duration

func (d duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration is a string such as \"10m\": %w", err)
	}
	parsed, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = duration(parsed)
	return nil
}

// sortedKeys keeps nil distinct from empty: CA returns nil GPU types when the RPC failed.
func sortedKeys(set map[string]struct{}) []string {
	if set == nil {
		return nil
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
