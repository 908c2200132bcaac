package main

// A re-implementation (our own code) of the client side of cluster-autoscaler's `externalgrpc`
// cloud provider, following the behaviour described in the upstream spec of the CA externalgrpc client (sections A.4-A.10):
// how CA dials, which errors it translates, what it caches, and how it turns replies into the
// values its core sees. It is NOT CA's code: the module proxy reachable here does not serve
// k8s.io/autoscaler/cluster-autoscaler, so CA's own package cannot be imported. What is real is
// the wire stack: google.golang.org/grpc (the grpc-go release Kubernetes 1.36 ships with),
// google.golang.org/protobuf, and k8s.io/api core/v1 Node.Unmarshal (gogo-generated, the call CA
// uses to decode nodeBytes).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sort"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	apiv1 "k8s.io/api/core/v1"
)

// errNotImplemented has the text of cloudprovider.ErrNotImplemented.
var errNotImplemented = errors.New("Not implemented")

// dialConfig is CA's cloud-config (address, cert, key, cacert, grpc_timeout).
type dialConfig struct {
	address string
	cert    string
	key     string
	cacert  string
	// Not a CA mode (CA has no server-only TLS): TLS that verifies the server against cacert but
	// presents no client certificate. Used to check that the server really requires one.
	tlsWithoutClientCert bool
}

// dial connects the way CA's createGRPCClient does: the address must be host:port; TLS only
// when cert is set (client certificate + RootCAs from cacert + ServerName = host), otherwise
// plaintext; grpc.Dial with no other options (lazy, passthrough resolver, default 4 MiB receive
// limit, no keepalive, no retries).
func dial(c dialConfig) (*grpc.ClientConn, error) {
	host, _, err := net.SplitHostPort(c.address)
	if err != nil {
		return nil, fmt.Errorf("failed to split address %q: %w", c.address, err)
	}
	var creds credentials.TransportCredentials
	switch {
	case c.cert != "":
		certificate, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return nil, fmt.Errorf("failed to read client certificate/key: %w", err)
		}
		pool, err := readPool(c.cacert)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(&tls.Config{
			ServerName:   host,
			Certificates: []tls.Certificate{certificate},
			RootCAs:      pool,
		})
	case c.tlsWithoutClientCert:
		pool, err := readPool(c.cacert)
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(&tls.Config{ServerName: host, RootCAs: pool})
	default:
		creds = insecure.NewCredentials()
	}
	//lint:ignore SA1019 grpc.Dial (not NewClient) is what CA calls: passthrough resolver, lazy dial.
	return grpc.Dial(c.address, grpc.WithTransportCredentials(creds)) //nolint:staticcheck
}

func readPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("failed to add CA certificate from %s", path)
	}
	return pool, nil
}

// node is the part of a v1.Node CA sends (externalGrpcNode: providerID, name, labels,
// annotations).
type node struct {
	ProviderID  string            `json:"providerID"`
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// nodeGroupView is what CA keeps of a NodeGroup: a snapshot of id/min/max/debug.
type nodeGroupView struct {
	ID      string `json:"id"`
	MinSize int    `json:"minSize"`
	MaxSize int    `json:"maxSize"`
	Debug   string `json:"debug"`
}

type instanceErrorView struct {
	ErrorClass   int    `json:"errorClass"`
	ErrorCode    string `json:"errorCode"`
	ErrorMessage string `json:"errorMessage"`
}

type instanceStatusView struct {
	State     int                `json:"state"`
	StateName string             `json:"stateName"`
	ErrorInfo *instanceErrorView `json:"errorInfo"`
}

type instanceView struct {
	ID     string              `json:"id"`
	Status *instanceStatusView `json:"status"`
}

// optionsView mirrors config.NodeGroupAutoscalingOptions as CA builds it from a reply.
type optionsView struct {
	ScaleDownUtilizationThreshold    float64 `json:"scaleDownUtilizationThreshold"`
	ScaleDownGpuUtilizationThreshold float64 `json:"scaleDownGpuUtilizationThreshold"`
	ScaleDownUnneededTime            string  `json:"scaleDownUnneededTime"`
	ScaleDownUnreadyTime             string  `json:"scaleDownUnreadyTime"`
	MaxNodeProvisionTime             string  `json:"maxNodeProvisionTime"`
	ZeroOrMaxNodeScaling             bool    `json:"zeroOrMaxNodeScaling"`
	IgnoreDaemonSetsUtilization      bool    `json:"ignoreDaemonSetsUtilization"`
	// Never transmitted: CA >= 1.35 reads 0 / false for these whenever the server answers.
	MaxNodeStartupTime         string `json:"maxNodeStartupTime"`
	AllowNonAtomicScaleUpToMax bool   `json:"allowNonAtomicScaleUpToMax"`
}

// defaults are the global options CA sends with GetOptions (the `defaults` field). Durations
// are Go duration strings. Missing values take CA's flag defaults.
type defaults struct {
	ScaleDownUtilizationThreshold    *float64 `json:"scaleDownUtilizationThreshold"`
	ScaleDownGpuUtilizationThreshold *float64 `json:"scaleDownGpuUtilizationThreshold"`
	ScaleDownUnneededTime            string   `json:"scaleDownUnneededTime"`
	ScaleDownUnreadyTime             string   `json:"scaleDownUnreadyTime"`
	MaxNodeProvisionTime             string   `json:"maxNodeProvisionTime"`
	ZeroOrMaxNodeScaling             bool     `json:"zeroOrMaxNodeScaling"`
	IgnoreDaemonSetsUtilization      bool     `json:"ignoreDaemonSetsUtilization"`
}

type templateView struct {
	Name          string            `json:"name"`
	ProviderID    string            `json:"providerID"`
	Labels        map[string]string `json:"labels"`
	Annotations   map[string]string `json:"annotations"`
	Capacity      map[string]string `json:"capacity"`
	Allocatable   map[string]string `json:"allocatable"`
	Taints        []taintView       `json:"taints"`
	Conditions    []conditionView   `json:"conditions"`
	Unschedulable bool              `json:"unschedulable"`
	NodeBytes     int               `json:"nodeBytes"`
}

type taintView struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Effect string `json:"effect"`
}

type conditionView struct {
	Type   string `json:"type"`
	Status string `json:"status"`
	Reason string `json:"reason"`
}

// outcome of one CA-level call.
type outcome struct {
	value  any
	err    error // the error CA's method returns
	rpcErr error // the RPC error, also when CA swallows it
	rpc    string
	cached bool
	extras []string
}

// provider holds CA's client-side state: the caches of externalGrpcCloudProvider and of its
// NodeGroup objects.
type provider struct {
	w       *wire
	conn    *grpc.ClientConn
	timeout time.Duration

	nodeGroups    []nodeGroupView // nil = not cached (an empty result is cached as a non-nil empty slice)
	nodeGroupsSet bool
	forNode       map[string]nodeGroupView
	gpuLabel      *string
	gpuTypes      []string
	gpuTypesSet   bool
	// TemplateNodeInfo is cached per NodeGroup object in CA; objects are rebuilt after every
	// Refresh, so caching by group id until the next Refresh is the same in a linear scenario.
	templates map[string]*templateView
}

func newProvider(w *wire, conn *grpc.ClientConn, timeout time.Duration) *provider {
	return &provider{w: w, conn: conn, timeout: timeout, forNode: map[string]nodeGroupView{}, templates: map[string]*templateView{}}
}

// invoke runs one unary RPC with its own timeout, like every CA call.
func (p *provider) invoke(rpc string, req protoreflect.ProtoMessage) (protoreflect.Message, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	resp := p.w.newResponse(rpc)
	if err := p.conn.Invoke(ctx, methodPath(rpc), req, resp); err != nil {
		return nil, err
	}
	return resp.ProtoReflect(), nil
}

func (p *provider) Refresh() outcome {
	// CA clears both caches before sending the RPC.
	p.nodeGroups, p.nodeGroupsSet = nil, false
	p.forNode = map[string]nodeGroupView{}
	p.templates = map[string]*templateView{}
	_, err := p.invoke("Refresh", p.w.newRequest("Refresh"))
	return outcome{err: err, rpcErr: err, rpc: "Refresh"}
}

func (p *provider) Cleanup() outcome {
	_, err := p.invoke("Cleanup", p.w.newRequest("Cleanup"))
	return outcome{err: err, rpcErr: err, rpc: "Cleanup"}
}

func groupView(m protoreflect.Message) nodeGroupView {
	return nodeGroupView{ID: getString(m, 1), MinSize: int(getInt32(m, 2)), MaxSize: int(getInt32(m, 3)), Debug: getString(m, 4)}
}

// NodeGroups: cached until Refresh; an RPC error is logged by CA and yields an empty list that
// is not cached.
func (p *provider) NodeGroups() outcome {
	if p.nodeGroupsSet {
		return outcome{value: p.nodeGroups, cached: true}
	}
	resp, err := p.invoke("NodeGroups", p.w.newRequest("NodeGroups"))
	if err != nil {
		return outcome{value: []nodeGroupView{}, rpcErr: err, rpc: "NodeGroups"}
	}
	groups := []nodeGroupView{}
	l := getList(resp, 1)
	for i := 0; i < l.Len(); i++ {
		groups = append(groups, groupView(l.Get(i).Message()))
	}
	p.nodeGroups, p.nodeGroupsSet = groups, true
	return outcome{value: groups, rpc: "NodeGroups", extras: extraFields(resp)}
}

func fillNode(m protoreflect.Message, n node) {
	setString(m, 1, n.ProviderID)
	setString(m, 2, n.Name)
	setStringMap(m, 3, n.Labels)
	setStringMap(m, 4, n.Annotations)
}

// NodeGroupForNode: cached per name+providerID until Refresh; "no group" (missing nodeGroup or
// id "") is nil and not cached; RPC errors are returned.
func (p *provider) NodeGroupForNode(n *node) outcome {
	if n == nil {
		return outcome{err: errors.New("node is nil")}
	}
	key := n.Name + n.ProviderID
	if g, ok := p.forNode[key]; ok {
		return outcome{value: g, cached: true}
	}
	req := p.w.newRequest("NodeGroupForNode")
	fillNode(mutable(req, 1), *n)
	resp, err := p.invoke("NodeGroupForNode", req)
	if err != nil {
		return outcome{err: err, rpcErr: err, rpc: "NodeGroupForNode"}
	}
	g := getMessage(resp, 1)
	if g == nil || getString(g, 1) == "" {
		return outcome{value: nil, rpc: "NodeGroupForNode", extras: extraFields(resp)}
	}
	v := groupView(g)
	p.forNode[key] = v
	return outcome{value: v, rpc: "NodeGroupForNode", extras: extraFields(resp)}
}

func (p *provider) TargetSize(id string) outcome {
	req := p.w.newRequest("NodeGroupTargetSize")
	setString(req, 1, id)
	resp, err := p.invoke("NodeGroupTargetSize", req)
	if err != nil {
		return outcome{err: err, rpcErr: err, rpc: "NodeGroupTargetSize"}
	}
	return outcome{value: int(getInt32(resp, 1)), rpc: "NodeGroupTargetSize", extras: extraFields(resp)}
}

func (p *provider) IncreaseSize(id string, delta int32) outcome {
	req := p.w.newRequest("NodeGroupIncreaseSize")
	setInt32(req, 1, delta)
	setString(req, 2, id)
	_, err := p.invoke("NodeGroupIncreaseSize", req)
	return outcome{err: err, rpcErr: err, rpc: "NodeGroupIncreaseSize"}
}

func (p *provider) DecreaseTargetSize(id string, delta int32) outcome {
	req := p.w.newRequest("NodeGroupDecreaseTargetSize")
	setInt32(req, 1, delta)
	setString(req, 2, id)
	_, err := p.invoke("NodeGroupDecreaseTargetSize", req)
	return outcome{err: err, rpcErr: err, rpc: "NodeGroupDecreaseTargetSize"}
}

func (p *provider) DeleteNodes(id string, nodes []node) outcome {
	req := p.w.newRequest("NodeGroupDeleteNodes")
	for _, n := range nodes {
		fillNode(appendMessage(req, 1), n)
	}
	setString(req, 2, id)
	_, err := p.invoke("NodeGroupDeleteNodes", req)
	return outcome{err: err, rpcErr: err, rpc: "NodeGroupDeleteNodes"}
}

// Nodes: state unspecified (or no status) -> nil Status, errorInfo dropped; otherwise the
// numeric state, and ErrorInfo only when errorCode != "".
func (p *provider) Nodes(id string) outcome {
	req := p.w.newRequest("NodeGroupNodes")
	setString(req, 1, id)
	resp, err := p.invoke("NodeGroupNodes", req)
	if err != nil {
		return outcome{err: err, rpcErr: err, rpc: "NodeGroupNodes"}
	}
	instances := []instanceView{}
	l := getList(resp, 1)
	for i := 0; i < l.Len(); i++ {
		m := l.Get(i).Message()
		inst := instanceView{ID: getString(m, 1)}
		if st := getMessage(m, 2); st != nil && getEnum(st, 1) != 0 {
			state := getEnum(st, 1)
			name, ok := caInstanceStates[state]
			if !ok {
				name = fmt.Sprintf("InstanceState(%d)", state)
			}
			view := &instanceStatusView{State: int(state), StateName: name}
			if ei := getMessage(st, 2); ei != nil && getString(ei, 1) != "" {
				view.ErrorInfo = &instanceErrorView{
					ErrorClass:   int(getInt32(ei, 3)),
					ErrorCode:    getString(ei, 1),
					ErrorMessage: getString(ei, 2),
				}
			}
			inst.Status = view
		}
		instances = append(instances, inst)
	}
	return outcome{value: instances, rpc: "NodeGroupNodes", extras: extraFields(resp)}
}

// TemplateNodeInfo: UNIMPLEMENTED -> ErrNotImplemented; nodeBytes decoded with
// k8s.io/api v1.Node.Unmarshal; empty nodeBytes with OK status -> a nil NodeInfo (which CA
// caches and its core later dereferences); success cached until Refresh.
func (p *provider) TemplateNodeInfo(id string) outcome {
	if t, ok := p.templates[id]; ok {
		return outcome{value: t, cached: true}
	}
	req := p.w.newRequest("NodeGroupTemplateNodeInfo")
	setString(req, 1, id)
	resp, err := p.invoke("NodeGroupTemplateNodeInfo", req)
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return outcome{err: errNotImplemented, rpcErr: err, rpc: "NodeGroupTemplateNodeInfo"}
		}
		return outcome{err: err, rpcErr: err, rpc: "NodeGroupTemplateNodeInfo"}
	}
	extras := extraFields(resp)
	b := getBytes(resp, 2)
	if len(b) == 0 {
		p.templates[id] = nil
		return outcome{value: nil, rpc: "NodeGroupTemplateNodeInfo", extras: extras}
	}
	var n apiv1.Node
	if err := n.Unmarshal(b); err != nil {
		return outcome{err: err, rpc: "NodeGroupTemplateNodeInfo", extras: extras}
	}
	t := &templateView{
		Name:          n.Name,
		ProviderID:    n.Spec.ProviderID,
		Labels:        n.Labels,
		Annotations:   n.Annotations,
		Capacity:      quantities(n.Status.Capacity),
		Allocatable:   quantities(n.Status.Allocatable),
		Taints:        []taintView{},
		Conditions:    []conditionView{},
		Unschedulable: n.Spec.Unschedulable,
		NodeBytes:     len(b),
	}
	for _, taint := range n.Spec.Taints {
		t.Taints = append(t.Taints, taintView{Key: taint.Key, Value: taint.Value, Effect: string(taint.Effect)})
	}
	for _, c := range n.Status.Conditions {
		t.Conditions = append(t.Conditions, conditionView{Type: string(c.Type), Status: string(c.Status), Reason: c.Reason})
	}
	p.templates[id] = t
	return outcome{value: t, rpc: "NodeGroupTemplateNodeInfo", extras: extras}
}

func quantities(l apiv1.ResourceList) map[string]string {
	out := map[string]string{}
	for k, q := range l {
		out[string(k)] = q.String()
	}
	return out
}

// CA's flag defaults for the options it sends.
const (
	defaultUtilization = 0.5
	defaultUnneeded    = 10 * time.Minute
	defaultUnready     = 20 * time.Minute
	defaultProvision   = 15 * time.Minute
)

// GetOptions: sends the defaults (thresholds 1/2, bools 6/7, durations 8/9/10 like CA >= 1.35);
// UNIMPLEMENTED -> ErrNotImplemented; a reply without the options message -> nil (CA uses its
// defaults); otherwise the options are built from the reply alone (missing Duration = 0).
func (p *provider) GetOptions(id string, d *defaults) outcome {
	if d == nil {
		d = &defaults{}
	}
	util, gpu := defaultUtilization, defaultUtilization
	if d.ScaleDownUtilizationThreshold != nil {
		util = *d.ScaleDownUtilizationThreshold
	}
	if d.ScaleDownGpuUtilizationThreshold != nil {
		gpu = *d.ScaleDownGpuUtilizationThreshold
	}
	unneeded, err := durationOr(d.ScaleDownUnneededTime, defaultUnneeded)
	if err != nil {
		return outcome{err: err}
	}
	unready, err := durationOr(d.ScaleDownUnreadyTime, defaultUnready)
	if err != nil {
		return outcome{err: err}
	}
	provision, err := durationOr(d.MaxNodeProvisionTime, defaultProvision)
	if err != nil {
		return outcome{err: err}
	}
	req := p.w.newRequest("NodeGroupGetOptions")
	setString(req, 1, id)
	o := mutable(req, 2)
	setDouble(o, 1, util)
	setDouble(o, 2, gpu)
	setBool(o, 6, d.ZeroOrMaxNodeScaling)
	setBool(o, 7, d.IgnoreDaemonSetsUtilization)
	setDuration(mutable(o, 8), unneeded)
	setDuration(mutable(o, 9), unready)
	setDuration(mutable(o, 10), provision)

	resp, err := p.invoke("NodeGroupGetOptions", req)
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return outcome{err: errNotImplemented, rpcErr: err, rpc: "NodeGroupGetOptions"}
		}
		return outcome{err: err, rpcErr: err, rpc: "NodeGroupGetOptions"}
	}
	extras := extraFields(resp)
	r := getMessage(resp, 1)
	if r == nil {
		return outcome{value: nil, rpc: "NodeGroupGetOptions", extras: extras}
	}
	v := optionsView{
		ScaleDownUtilizationThreshold:    getDouble(r, 1),
		ScaleDownGpuUtilizationThreshold: getDouble(r, 2),
		ScaleDownUnneededTime:            readDuration(getMessage(r, 8)).String(),
		ScaleDownUnreadyTime:             readDuration(getMessage(r, 9)).String(),
		MaxNodeProvisionTime:             readDuration(getMessage(r, 10)).String(),
		ZeroOrMaxNodeScaling:             getBool(r, 6),
		IgnoreDaemonSetsUtilization:      getBool(r, 7),
		MaxNodeStartupTime:               time.Duration(0).String(),
	}
	return outcome{value: v, rpc: "NodeGroupGetOptions", extras: extras}
}

func durationOr(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("scenario: bad duration %q: %w", s, err)
	}
	return d, nil
}

// google.protobuf.Duration / Timestamp: seconds = 1, nanos = 2.
func setDuration(m protoreflect.Message, d time.Duration) {
	m.Set(field(m, 1), protoreflect.ValueOfInt64(int64(d/time.Second)))
	m.Set(field(m, 2), protoreflect.ValueOfInt32(int32(d%time.Second)))
}

// readDuration converts like durationpb.AsDuration: nil -> 0, saturating on overflow.
func readDuration(m protoreflect.Message) time.Duration {
	if m == nil {
		return 0
	}
	secs, nanos := getInt64(m, 1), int64(getInt32(m, 2))
	if secs > math.MaxInt64/int64(time.Second) {
		return time.Duration(math.MaxInt64)
	}
	if secs < math.MinInt64/int64(time.Second) {
		return time.Duration(math.MinInt64)
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos)
}

func setTimestamp(m protoreflect.Message, t time.Time) {
	m.Set(field(m, 1), protoreflect.ValueOfInt64(t.Unix()))
	m.Set(field(m, 2), protoreflect.ValueOfInt32(int32(t.Nanosecond())))
}

// GPULabel: cached forever after the first success; an error yields "" (not cached).
func (p *provider) GPULabel() outcome {
	if p.gpuLabel != nil {
		return outcome{value: *p.gpuLabel, cached: true}
	}
	resp, err := p.invoke("GPULabel", p.w.newRequest("GPULabel"))
	if err != nil {
		return outcome{value: "", rpcErr: err, rpc: "GPULabel"}
	}
	l := getString(resp, 1)
	p.gpuLabel = &l
	return outcome{value: l, rpc: "GPULabel", extras: extraFields(resp)}
}

// GetAvailableGPUTypes: only the keys are kept; cached forever after the first success; an
// error yields nil.
func (p *provider) GetAvailableGPUTypes() outcome {
	if p.gpuTypesSet {
		return outcome{value: p.gpuTypes, cached: true}
	}
	resp, err := p.invoke("GetAvailableGPUTypes", p.w.newRequest("GetAvailableGPUTypes"))
	if err != nil {
		return outcome{value: nil, rpcErr: err, rpc: "GetAvailableGPUTypes"}
	}
	keys := getMapKeys(resp, 1)
	if keys == nil {
		keys = []string{}
	}
	sort.Strings(keys)
	p.gpuTypes, p.gpuTypesSet = keys, true
	return outcome{value: keys, rpc: "GetAvailableGPUTypes", extras: extraFields(resp)}
}

func (p *provider) NodePrice(n *node, start, end time.Time) outcome {
	req := p.w.newRequest("PricingNodePrice")
	if n != nil {
		fillNode(mutable(req, 1), *n)
	}
	setTimestamp(mutable(req, 4), start)
	setTimestamp(mutable(req, 5), end)
	resp, err := p.invoke("PricingNodePrice", req)
	return priceOutcome("PricingNodePrice", resp, err)
}

// PodPrice: the pod (scenario JSON, decoded into k8s.io/api v1.Pod) is sent as
// pod_bytes = v1.Pod.Marshal(), like CA.
func (p *provider) PodPrice(podJSON json.RawMessage, start, end time.Time) outcome {
	var pod apiv1.Pod
	if len(podJSON) > 0 {
		if err := json.Unmarshal(podJSON, &pod); err != nil {
			return outcome{err: fmt.Errorf("scenario: bad pod: %w", err)}
		}
	}
	b, err := pod.Marshal()
	if err != nil {
		return outcome{err: err}
	}
	req := p.w.newRequest("PricingPodPrice")
	setBytes(req, 4, b)
	setTimestamp(mutable(req, 5), start)
	setTimestamp(mutable(req, 6), end)
	resp, err := p.invoke("PricingPodPrice", req)
	return priceOutcome("PricingPodPrice", resp, err)
}

func priceOutcome(rpc string, resp protoreflect.Message, err error) outcome {
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return outcome{err: errNotImplemented, rpcErr: err, rpc: rpc}
		}
		return outcome{err: err, rpcErr: err, rpc: rpc}
	}
	return outcome{value: getDouble(resp, 1), rpc: rpc, extras: extraFields(resp)}
}
