// nodegroup-conformance drives an externalgrpc cloud-provider server through cluster-autoscaler's
// own client, one CA release's k8s.io/autoscaler/cluster-autoscaler/cloudprovider/externalgrpc
// package, and reports what CA's CloudProvider and NodeGroup methods return. Tests assert on
// that report: it is the server as CA sees it, with CA's caches, error mapping and decoding.
//
// One source serves every release from 1.29 on: main.go and views.go are common, and
// provider_ca<generation>.go, selected by a build tag, builds the provider the way that
// generation's CA does (tests/upstream/build.sh maps each version to its tag and stamps the
// version into caVersion). Methods a release's client does not have (NodeGroup.AtomicIncreaseSize
// before 1.30, ForceDeleteNodes before 1.31) and option fields its config lacks
// (AllowNonAtomicScaleUpToMax before 1.34, MaxNodeStartupTime before 1.35) answer with an error
// "... is not in CA <version>" and "unsupported": true instead of a value.
//
// Usage:
//
//	nodegroup-conformance --cloud-config cloud-config.yaml [--scenario calls.json] [-v 5]
//	nodegroup-conformance --version
//
// The cloud config is CA's own file (address, cert, key, cacert, grpc_timeout), read by
// externalgrpc.BuildExternalGrpc as with `cluster-autoscaler --cloud-config`; on a bad one CA
// exits through klog.Fatal (status 255). The scenario is a stream of JSON calls, from the file or
// from stdin ("-", the default), for example
//
//	{"call": "Refresh"}
//	{"call": "TargetSize", "group": "MachineDeployment/ns/md"}
//
// Each result is printed as one JSON line on stdout as soon as the call returns, so a test can
// drive one provider step by step, as CA does over its lifetime. See call for the fields and
// result for the output. A panic inside CA's method (CA itself would crash) is reported as that
// call's result with "panic": true, and the scenario goes on. -v sets klog's verbosity: CA logs
// the errors it swallows at 1 and every RPC and cache hit at 5. --version prints the CA release
// the program links. Exit status: 0 at the end of the scenario, 2 on a usage or scenario error.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"google.golang.org/grpc/status"
	apiv1 "k8s.io/api/core/v1"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider"
	"k8s.io/autoscaler/cluster-autoscaler/config"
	"k8s.io/klog/v2"
)

// caVersion is the CA release whose client this binary links, stamped by tests/upstream/build.sh
// (-ldflags -X main.caVersion=<version>).
var caVersion = "unknown"

// call is one scenario step: a CloudProvider or NodeGroup method and its arguments.
type call struct {
	Call string `json:"call"`
	// The group NodeGroup methods run on: the one with this id in NodeGroups() (CA's list,
	// cached until the next Refresh), or, with GroupOf, the one NodeGroupForNode returns.
	Group   string `json:"group,omitempty"`
	GroupOf *node  `json:"groupOf,omitempty"`
	// NodeGroupForNode, HasInstance, NodePrice.
	Node *node `json:"node,omitempty"`
	// DeleteNodes, ForceDeleteNodes.
	Nodes []node `json:"nodes,omitempty"`
	// IncreaseSize, AtomicIncreaseSize, DecreaseTargetSize.
	Delta int `json:"delta,omitempty"`
	// PodPrice.
	Pod *apiv1.Pod `json:"pod,omitempty"`
	// NodePrice, PodPrice: the priced window starts now and lasts this many hours (default 1).
	Hours float64 `json:"hours,omitempty"`
	// GetOptions: fields overriding CA's defaults (its flag defaults), as in options.
	Defaults json.RawMessage `json:"defaults,omitempty"`
}

// result is what one call returned, printed as one JSON line.
type result struct {
	Call  string `json:"call"`
	Group string `json:"group,omitempty"`
	// The method's return value, also when it returned an error (HasInstance returns true with
	// ErrNotImplemented); null for methods returning only an error.
	Value any    `json:"value"`
	Error string `json:"error,omitempty"`
	// The error is cloudprovider.ErrNotImplemented: CA falls back (defaults, no template, no
	// prices) instead of treating it as a failure.
	NotImplemented bool `json:"notImplemented"`
	// The gRPC status code the error carries, when it carries one.
	Code string `json:"code,omitempty"`
	// The method does not exist in this CA release (or the call named an option field its
	// config lacks): Error says what, and nothing reached the server.
	Unsupported bool `json:"unsupported,omitempty"`
	// CA's method panicked (Error has the panic value): CA itself would have crashed.
	Panic bool `json:"panic,omitempty"`
	// Duration of the method call alone (not the group lookup).
	Millis float64 `json:"ms"`
}

// unsupported is the error of a call this CA release cannot make.
type unsupported struct{ what string }

func (u unsupported) Error() string {
	return fmt.Sprintf("%s is not in CA %s", u.what, caVersion)
}

// panicked is the error of a CA method that panicked.
type panicked struct {
	value any
	stack string
}

func (p panicked) Error() string {
	return fmt.Sprintf("panic in CA %s: %v", caVersion, p.value)
}

// scenarioError is a mistake in the scenario, not something CA returned.
type scenarioError struct{ error }

// session is one CA provider and the defaults CA's core would pass to GetOptions.
type session struct {
	provider cloudprovider.CloudProvider
	defaults config.NodeGroupAutoscalingOptions
}

type providerCall func(s *session, c call) (any, error)
type groupCall func(s *session, ng cloudprovider.NodeGroup, c call) (any, error)

// providerCalls are the CloudProvider methods a scenario can call.
var providerCalls = map[string]providerCall{
	"NodeGroups": func(s *session, _ call) (any, error) {
		return groupViews(s.provider.NodeGroups()), nil
	},
	"NodeGroupForNode": func(s *session, c call) (any, error) {
		ng, err := s.provider.NodeGroupForNode(c.Node.apiNode())
		return viewGroup(ng), err
	},
	"HasInstance": func(s *session, c call) (any, error) {
		return s.provider.HasInstance(c.Node.apiNode())
	},
	"NodePrice": func(s *session, c call) (any, error) {
		pricing, err := s.provider.Pricing()
		if err != nil {
			return nil, err
		}
		start, end := c.window()
		return pricing.NodePrice(c.Node.apiNode(), start, end)
	},
	"PodPrice": func(s *session, c call) (any, error) {
		pricing, err := s.provider.Pricing()
		if err != nil {
			return nil, err
		}
		start, end := c.window()
		return pricing.PodPrice(c.Pod, start, end)
	},
	"GPULabel": func(s *session, _ call) (any, error) { return s.provider.GPULabel(), nil },
	"GetAvailableGPUTypes": func(s *session, _ call) (any, error) {
		return sortedKeys(s.provider.GetAvailableGPUTypes()), nil
	},
	"Refresh": func(s *session, _ call) (any, error) { return nil, s.provider.Refresh() },
	"Cleanup": func(s *session, _ call) (any, error) { return nil, s.provider.Cleanup() },
}

// groupCalls are the NodeGroup methods a scenario can call.
var groupCalls = map[string]groupCall{
	"Id":              func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.Id(), nil },
	"Debug":           func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.Debug(), nil },
	"MinSize":         func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.MinSize(), nil },
	"MaxSize":         func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.MaxSize(), nil },
	"Exist":           func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.Exist(), nil },
	"Autoprovisioned": func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.Autoprovisioned(), nil },
	"TargetSize":      func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) { return ng.TargetSize() },
	"IncreaseSize": func(_ *session, ng cloudprovider.NodeGroup, c call) (any, error) {
		return nil, ng.IncreaseSize(c.Delta)
	},
	// Not in CA 1.29's NodeGroup interface: looked up on the group, so one source builds for
	// every release.
	"AtomicIncreaseSize": func(_ *session, ng cloudprovider.NodeGroup, c call) (any, error) {
		atomic, ok := ng.(interface{ AtomicIncreaseSize(int) error })
		if !ok {
			return nil, unsupported{"NodeGroup.AtomicIncreaseSize"}
		}
		return nil, atomic.AtomicIncreaseSize(c.Delta)
	},
	"DecreaseTargetSize": func(_ *session, ng cloudprovider.NodeGroup, c call) (any, error) {
		return nil, ng.DecreaseTargetSize(c.Delta)
	},
	"DeleteNodes": func(_ *session, ng cloudprovider.NodeGroup, c call) (any, error) {
		return nil, ng.DeleteNodes(apiNodes(c.Nodes))
	},
	// Not in CA 1.29 and 1.30 (as AtomicIncreaseSize).
	"ForceDeleteNodes": func(_ *session, ng cloudprovider.NodeGroup, c call) (any, error) {
		force, ok := ng.(interface{ ForceDeleteNodes([]*apiv1.Node) error })
		if !ok {
			return nil, unsupported{"NodeGroup.ForceDeleteNodes"}
		}
		return nil, force.ForceDeleteNodes(apiNodes(c.Nodes))
	},
	"Nodes": func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) {
		instances, err := ng.Nodes()
		return instanceViews(instances), err
	},
	// CA 1.29-1.31 return the scheduler's NodeInfo, 1.32 and later CA's own
	// simulator/framework one: both have Node().
	"TemplateNodeInfo": func(_ *session, ng cloudprovider.NodeGroup, _ call) (any, error) {
		info, err := ng.TemplateNodeInfo()
		if info == nil {
			return nil, err
		}
		return viewNode(info.Node()), err
	},
	"GetOptions": func(s *session, ng cloudprovider.NodeGroup, c call) (any, error) {
		defaults := viewOptions(s.defaults)
		if len(c.Defaults) > 0 {
			dec := json.NewDecoder(bytes.NewReader(c.Defaults))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&defaults); err != nil {
				return nil, scenarioError{fmt.Errorf("GetOptions defaults: %w", err)}
			}
		}
		sent, err := defaults.config()
		if err != nil {
			return nil, err
		}
		opts, err := ng.GetOptions(sent)
		if opts == nil {
			return nil, err
		}
		return viewOptions(*opts), err
	},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nodegroup-conformance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	klog.InitFlags(fs)
	cloudConfig := fs.String("cloud-config", "", "CA's externalgrpc cloud-config file (address, cert, key, cacert, grpc_timeout)")
	scenarioPath := fs.String("scenario", "-", "file of JSON calls; - for stdin")
	version := fs.Bool("version", false, "print the cluster-autoscaler release whose client this is, and exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *version {
		fmt.Fprintln(stdout, caVersion)
		return 0
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "nodegroup-conformance: "+format+"\n", a...)
		return 2
	}
	if *cloudConfig == "" || fs.NArg() > 0 {
		return fail("usage: --cloud-config FILE [--scenario FILE|-]")
	}
	in := stdin
	if *scenarioPath != "-" {
		f, err := os.Open(*scenarioPath)
		if err != nil {
			return fail("reading the scenario: %v", err)
		}
		defer f.Close()
		in = f
	}

	// The provider as CA's main builds it from its flags (all at their defaults here), so
	// GetOptions gets the defaults a stock cluster-autoscaler of this release sends.
	provider, defaults := buildProvider(*cloudConfig)
	s := &session{provider: provider, defaults: defaults}

	dec := json.NewDecoder(in)
	dec.DisallowUnknownFields()
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	for step := 0; ; step++ {
		var c call
		if err := dec.Decode(&c); errors.Is(err, io.EOF) {
			return 0
		} else if err != nil {
			return fail("scenario step %d: %v", step, err)
		}
		r, err := s.run(c)
		if err != nil {
			return fail("scenario step %d (%s): %v", step, c.Call, err)
		}
		if err := enc.Encode(r); err != nil {
			return fail("writing the result of step %d: %v", step, err)
		}
	}
}

// run performs one call. Its error is a scenario error (unknown call or group); what CA's method
// returned, error included, is in the result.
func (s *session) run(c call) (result, error) {
	r := result{Call: c.Call}
	var value any
	var err error
	var start time.Time
	if f, ok := providerCalls[c.Call]; ok {
		start = time.Now()
		value, err = guard(func() (any, error) { return f(s, c) })
	} else if f, ok := groupCalls[c.Call]; ok {
		ng, lookupErr := s.group(c)
		if lookupErr != nil {
			return r, lookupErr
		}
		r.Group = ng.Id()
		start = time.Now()
		value, err = guard(func() (any, error) { return f(s, ng, c) })
	} else {
		return r, fmt.Errorf("unknown call %q", c.Call)
	}
	r.Millis = float64(time.Since(start).Microseconds()) / 1000
	if se := (scenarioError{}); errors.As(err, &se) {
		return r, se
	}
	r.Value = value
	if err != nil {
		r.Error = err.Error()
		r.NotImplemented = errors.Is(err, cloudprovider.ErrNotImplemented)
		r.Unsupported = errors.As(err, &unsupported{})
		var p panicked
		if r.Panic = errors.As(err, &p); r.Panic {
			klog.Errorf("%v\n%s", p, p.stack)
		} else if st, ok := status.FromError(err); ok {
			r.Code = st.Code().String()
		}
	}
	return r, nil
}

// guard runs one CA method, turning a panic into a panicked error: CA would crash there, the
// scenario reports it and goes on (the provider's state is whatever CA left).
func guard(f func() (any, error)) (value any, err error) {
	defer func() {
		if v := recover(); v != nil {
			value, err = nil, panicked{value: v, stack: string(debug.Stack())}
		}
	}()
	return f()
}

// group finds the node group a NodeGroup method runs on, the way CA's core gets hold of groups.
func (s *session) group(c call) (cloudprovider.NodeGroup, error) {
	if c.GroupOf != nil {
		ng, err := s.provider.NodeGroupForNode(c.GroupOf.apiNode())
		if err != nil {
			return nil, fmt.Errorf("NodeGroupForNode(%s): %w", c.GroupOf.Name, err)
		}
		if ng == nil {
			return nil, fmt.Errorf("node %s (%s) is in no node group", c.GroupOf.Name, c.GroupOf.ProviderID)
		}
		return ng, nil
	}
	groups := s.provider.NodeGroups()
	if i := slices.IndexFunc(groups, func(ng cloudprovider.NodeGroup) bool { return ng.Id() == c.Group }); i >= 0 {
		return groups[i], nil
	}
	return nil, fmt.Errorf("no node group %q among the %d NodeGroups()", c.Group, len(groups))
}

// window is the pricing window: from now, c.Hours long (default one hour).
func (c call) window() (time.Time, time.Time) {
	hours := c.Hours
	if hours == 0 {
		hours = 1
	}
	start := time.Now()
	return start, start.Add(time.Duration(hours * float64(time.Hour)))
}
