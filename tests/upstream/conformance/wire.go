package main

// Message and service descriptors, compiled at run time from proto/externalgrpc.proto (the
// single source of truth for our server) with bufbuild/protocompile, plus an independent table
// of the wire layout cluster-autoscaler 1.36 uses (field numbers and types, written from the
// upstream spec, section A.2). The table is what makes this a conformance client rather than a
// mirror of our own .proto: if our file ever drifted from CA's numbering (a field renumbered, an
// int32 turned into a sint32, an RPC renamed), server and this client would still agree with each
// other, but the check below fails.

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// The gRPC identity of CA's client: package and service, so full method paths are
// /clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/<Rpc>.
const (
	caPackage = "clusterautoscaler.cloudprovider.v1.externalgrpc"
	caService = caPackage + ".CloudProvider"
)

// caRPCs: method -> [request message, response message] as named by CA.
var caRPCs = map[string][2]string{
	"NodeGroups":                  {"NodeGroupsRequest", "NodeGroupsResponse"},
	"NodeGroupForNode":            {"NodeGroupForNodeRequest", "NodeGroupForNodeResponse"},
	"PricingNodePrice":            {"PricingNodePriceRequest", "PricingNodePriceResponse"},
	"PricingPodPrice":             {"PricingPodPriceRequest", "PricingPodPriceResponse"},
	"GPULabel":                    {"GPULabelRequest", "GPULabelResponse"},
	"GetAvailableGPUTypes":        {"GetAvailableGPUTypesRequest", "GetAvailableGPUTypesResponse"},
	"Cleanup":                     {"CleanupRequest", "CleanupResponse"},
	"Refresh":                     {"RefreshRequest", "RefreshResponse"},
	"NodeGroupTargetSize":         {"NodeGroupTargetSizeRequest", "NodeGroupTargetSizeResponse"},
	"NodeGroupIncreaseSize":       {"NodeGroupIncreaseSizeRequest", "NodeGroupIncreaseSizeResponse"},
	"NodeGroupDeleteNodes":        {"NodeGroupDeleteNodesRequest", "NodeGroupDeleteNodesResponse"},
	"NodeGroupDecreaseTargetSize": {"NodeGroupDecreaseTargetSizeRequest", "NodeGroupDecreaseTargetSizeResponse"},
	"NodeGroupNodes":              {"NodeGroupNodesRequest", "NodeGroupNodesResponse"},
	"NodeGroupTemplateNodeInfo":   {"NodeGroupTemplateNodeInfoRequest", "NodeGroupTemplateNodeInfoResponse"},
	"NodeGroupGetOptions":         {"NodeGroupAutoscalingOptionsRequest", "NodeGroupAutoscalingOptionsResponse"},
}

type caField struct {
	num  protoreflect.FieldNumber
	name string // CA's name; informational only (names are not on the wire)
	typ  string // notation of typeString below
}

// caMessages: the fields a CA 1.36 client writes or reads, by message (CA >= 1.35 layout:
// nodeBytes = 2, durations 8/9/10, timestamps 4/5 and 5/6). Field names and message names do not
// travel on the wire; numbers and types do.
var caMessages = map[string][]caField{
	"NodeGroup":                {{1, "id", "string"}, {2, "minSize", "int32"}, {3, "maxSize", "int32"}, {4, "debug", "string"}},
	"ExternalGrpcNode":         {{1, "providerID", "string"}, {2, "name", "string"}, {3, "labels", "map<string,string>"}, {4, "annotations", "map<string,string>"}},
	"NodeGroupsRequest":        {},
	"NodeGroupsResponse":       {{1, "nodeGroups", "[]NodeGroup"}},
	"NodeGroupForNodeRequest":  {{1, "node", "ExternalGrpcNode"}},
	"NodeGroupForNodeResponse": {{1, "nodeGroup", "NodeGroup"}},
	"PricingNodePriceRequest": {{1, "node", "ExternalGrpcNode"}, {4, "startTimestamp", "google.protobuf.Timestamp"},
		{5, "endTimestamp", "google.protobuf.Timestamp"}},
	"PricingNodePriceResponse": {{1, "price", "double"}},
	"PricingPodPriceRequest": {{4, "pod_bytes", "bytes"}, {5, "startTimestamp", "google.protobuf.Timestamp"},
		{6, "endTimestamp", "google.protobuf.Timestamp"}},
	"PricingPodPriceResponse":             {{1, "price", "double"}},
	"GPULabelRequest":                     {},
	"GPULabelResponse":                    {{1, "label", "string"}},
	"GetAvailableGPUTypesRequest":         {},
	"GetAvailableGPUTypesResponse":        {{1, "gpuTypes", "map<string,google.protobuf.Any>"}},
	"CleanupRequest":                      {},
	"CleanupResponse":                     {},
	"RefreshRequest":                      {},
	"RefreshResponse":                     {},
	"NodeGroupTargetSizeRequest":          {{1, "id", "string"}},
	"NodeGroupTargetSizeResponse":         {{1, "targetSize", "int32"}},
	"NodeGroupIncreaseSizeRequest":        {{1, "delta", "int32"}, {2, "id", "string"}},
	"NodeGroupIncreaseSizeResponse":       {},
	"NodeGroupDeleteNodesRequest":         {{1, "nodes", "[]ExternalGrpcNode"}, {2, "id", "string"}},
	"NodeGroupDeleteNodesResponse":        {},
	"NodeGroupDecreaseTargetSizeRequest":  {{1, "delta", "int32"}, {2, "id", "string"}},
	"NodeGroupDecreaseTargetSizeResponse": {},
	"NodeGroupNodesRequest":               {{1, "id", "string"}},
	"NodeGroupNodesResponse":              {{1, "instances", "[]Instance"}},
	"Instance":                            {{1, "id", "string"}, {2, "status", "InstanceStatus"}},
	"InstanceStatus":                      {{1, "instanceState", "enum InstanceStatus.InstanceState"}, {2, "errorInfo", "InstanceErrorInfo"}},
	"InstanceErrorInfo":                   {{1, "errorCode", "string"}, {2, "errorMessage", "string"}, {3, "instanceErrorClass", "int32"}},
	"NodeGroupTemplateNodeInfoRequest":    {{1, "id", "string"}},
	"NodeGroupTemplateNodeInfoResponse":   {{2, "nodeBytes", "bytes"}},
	"NodeGroupAutoscalingOptions": {{1, "scaleDownUtilizationThreshold", "double"}, {2, "scaleDownGpuUtilizationThreshold", "double"},
		{6, "zeroOrMaxNodeScaling", "bool"}, {7, "ignoreDaemonSetsUtilization", "bool"},
		{8, "scaleDownUnneededDuration", "google.protobuf.Duration"}, {9, "scaleDownUnreadyDuration", "google.protobuf.Duration"},
		{10, "MaxNodeProvisionDuration", "google.protobuf.Duration"}},
	"NodeGroupAutoscalingOptionsRequest":  {{1, "id", "string"}, {2, "defaults", "NodeGroupAutoscalingOptions"}},
	"NodeGroupAutoscalingOptionsResponse": {{1, "nodeGroupAutoscalingOptions", "NodeGroupAutoscalingOptions"}},
}

// CA's InstanceState numbers (the same numbers as cloudprovider.InstanceState).
var caInstanceStates = map[protoreflect.EnumNumber]string{0: "unspecified", 1: "Running", 2: "Creating", 3: "Deleting"}

type wire struct {
	file    protoreflect.FileDescriptor
	service protoreflect.ServiceDescriptor
}

// loadWire compiles the .proto at path and checks it against CA's layout.
func loadWire(path string) (*wire, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			ImportPaths: []string{filepath.Dir(abs)},
		}),
	}
	files, err := compiler.Compile(context.Background(), filepath.Base(abs))
	if err != nil {
		return nil, fmt.Errorf("compiling %s: %w", path, err)
	}
	fd := files[0]
	if string(fd.Package()) != caPackage {
		return nil, fmt.Errorf("%s: package %q, CA uses %q", path, fd.Package(), caPackage)
	}
	svc := fd.Services().ByName("CloudProvider")
	if svc == nil {
		return nil, fmt.Errorf("%s: no service CloudProvider", path)
	}
	w := &wire{file: fd, service: svc}
	if problems := w.check(); len(problems) > 0 {
		return nil, fmt.Errorf("%s does not match cluster-autoscaler's wire layout:\n  %s", path, strings.Join(problems, "\n  "))
	}
	return w, nil
}

func (w *wire) check() []string {
	var problems []string
	names := make([]string, 0, len(caRPCs))
	for n := range caRPCs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		io := caRPCs[name]
		m := w.service.Methods().ByName(protoreflect.Name(name))
		if m == nil {
			problems = append(problems, fmt.Sprintf("rpc %s missing", name))
			continue
		}
		if m.IsStreamingClient() || m.IsStreamingServer() {
			problems = append(problems, fmt.Sprintf("rpc %s is streaming; CA's is unary", name))
		}
		if got := relName(m.Input().FullName()); got != io[0] {
			problems = append(problems, fmt.Sprintf("rpc %s takes %s; CA sends %s", name, got, io[0]))
		}
		if got := relName(m.Output().FullName()); got != io[1] {
			problems = append(problems, fmt.Sprintf("rpc %s returns %s; CA reads %s", name, got, io[1]))
		}
	}
	msgs := make([]string, 0, len(caMessages))
	for n := range caMessages {
		msgs = append(msgs, n)
	}
	sort.Strings(msgs)
	for _, name := range msgs {
		md := w.message(name)
		if md == nil {
			problems = append(problems, fmt.Sprintf("message %s missing", name))
			continue
		}
		for _, f := range caMessages[name] {
			fd := md.Fields().ByNumber(f.num)
			if fd == nil {
				problems = append(problems, fmt.Sprintf("%s: field %d (%s) missing", name, f.num, f.name))
				continue
			}
			if got := typeString(fd); got != f.typ {
				problems = append(problems, fmt.Sprintf("%s: field %d (%s) is %s; CA uses %s", name, f.num, f.name, got, f.typ))
			}
		}
	}
	if e := w.message("InstanceStatus"); e != nil {
		if ed := e.Enums().ByName("InstanceState"); ed != nil {
			for n := range caInstanceStates {
				if ed.Values().ByNumber(n) == nil {
					problems = append(problems, fmt.Sprintf("InstanceStatus.InstanceState: value %d missing", n))
				}
			}
		}
	}
	return problems
}

// message finds a top-level or nested message by its name relative to CA's package.
func (w *wire) message(rel string) protoreflect.MessageDescriptor {
	parts := strings.Split(rel, ".")
	md := w.file.Messages().ByName(protoreflect.Name(parts[0]))
	for _, p := range parts[1:] {
		if md == nil {
			return nil
		}
		md = md.Messages().ByName(protoreflect.Name(p))
	}
	return md
}

func relName(n protoreflect.FullName) string {
	return strings.TrimPrefix(string(n), caPackage+".")
}

// typeString renders a field's wire type: "int32", "[]NodeGroup", "map<string,string>",
// "google.protobuf.Duration", "enum InstanceStatus.InstanceState".
func typeString(fd protoreflect.FieldDescriptor) string {
	if fd.IsMap() {
		return fmt.Sprintf("map<%s,%s>", typeString(fd.MapKey()), typeString(fd.MapValue()))
	}
	var s string
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		s = relName(fd.Message().FullName())
	case protoreflect.EnumKind:
		s = "enum " + relName(fd.Enum().FullName())
	default:
		s = fd.Kind().String()
	}
	if fd.IsList() {
		s = "[]" + s
	}
	return s
}

// newRequest returns an empty request message for rpc.
func (w *wire) newRequest(rpc string) *dynamicpb.Message {
	return dynamicpb.NewMessage(w.service.Methods().ByName(protoreflect.Name(rpc)).Input())
}

func (w *wire) newResponse(rpc string) *dynamicpb.Message {
	return dynamicpb.NewMessage(w.service.Methods().ByName(protoreflect.Name(rpc)).Output())
}

func methodPath(rpc string) string { return "/" + caService + "/" + rpc }

// extraFields lists populated fields of m (recursively through CA-known messages) that a CA
// 1.36 client does not read; for information only (proto3 clients skip unknown fields).
func extraFields(m protoreflect.Message) []string {
	var out []string
	var walk func(m protoreflect.Message)
	walk = func(m protoreflect.Message) {
		name := relName(m.Descriptor().FullName())
		known, isCA := caMessages[name]
		if !isCA {
			return
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			ca := false
			for _, f := range known {
				if f.num == fd.Number() {
					ca = true
				}
			}
			if !ca {
				out = append(out, fmt.Sprintf("%s.%s=%d", name, fd.Name(), fd.Number()))
				return true
			}
			if fd.Kind() == protoreflect.MessageKind && !fd.IsMap() {
				if fd.IsList() {
					l := v.List()
					for i := 0; i < l.Len(); i++ {
						walk(l.Get(i).Message())
					}
				} else {
					walk(v.Message())
				}
			}
			return true
		})
	}
	walk(m)
	sort.Strings(out)
	out = dedupe(out)
	return out
}

func dedupe(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || s[i-1] != v {
			out = append(out, v)
		}
	}
	return out
}

// Field access by number (numbers come from caMessages and were checked by loadWire).

func field(m protoreflect.Message, n protoreflect.FieldNumber) protoreflect.FieldDescriptor {
	fd := m.Descriptor().Fields().ByNumber(n)
	if fd == nil {
		panic(fmt.Sprintf("%s has no field %d", m.Descriptor().FullName(), n))
	}
	return fd
}

func setString(m protoreflect.Message, n protoreflect.FieldNumber, v string) {
	m.Set(field(m, n), protoreflect.ValueOfString(v))
}
func setInt32(m protoreflect.Message, n protoreflect.FieldNumber, v int32) {
	m.Set(field(m, n), protoreflect.ValueOfInt32(v))
}
func setDouble(m protoreflect.Message, n protoreflect.FieldNumber, v float64) {
	m.Set(field(m, n), protoreflect.ValueOfFloat64(v))
}
func setBool(m protoreflect.Message, n protoreflect.FieldNumber, v bool) {
	m.Set(field(m, n), protoreflect.ValueOfBool(v))
}
func setBytes(m protoreflect.Message, n protoreflect.FieldNumber, v []byte) {
	m.Set(field(m, n), protoreflect.ValueOfBytes(v))
}
func setStringMap(m protoreflect.Message, n protoreflect.FieldNumber, v map[string]string) {
	if len(v) == 0 {
		return
	}
	mp := m.Mutable(field(m, n)).Map()
	for k, x := range v {
		mp.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(x))
	}
}

// mutable returns the sub-message at n, creating it (so it is sent even when empty).
func mutable(m protoreflect.Message, n protoreflect.FieldNumber) protoreflect.Message {
	return m.Mutable(field(m, n)).Message()
}

// appendMessage appends a new element to repeated message field n and returns it.
func appendMessage(m protoreflect.Message, n protoreflect.FieldNumber) protoreflect.Message {
	l := m.Mutable(field(m, n)).List()
	e := l.NewElement()
	l.Append(e)
	return e.Message()
}

func getString(m protoreflect.Message, n protoreflect.FieldNumber) string {
	return m.Get(field(m, n)).String()
}
func getInt32(m protoreflect.Message, n protoreflect.FieldNumber) int32 {
	return int32(m.Get(field(m, n)).Int())
}
func getInt64(m protoreflect.Message, n protoreflect.FieldNumber) int64 {
	return m.Get(field(m, n)).Int()
}
func getDouble(m protoreflect.Message, n protoreflect.FieldNumber) float64 {
	return m.Get(field(m, n)).Float()
}
func getBool(m protoreflect.Message, n protoreflect.FieldNumber) bool {
	return m.Get(field(m, n)).Bool()
}
func getBytes(m protoreflect.Message, n protoreflect.FieldNumber) []byte {
	return m.Get(field(m, n)).Bytes()
}
func getEnum(m protoreflect.Message, n protoreflect.FieldNumber) protoreflect.EnumNumber {
	return m.Get(field(m, n)).Enum()
}

// getMessage returns the sub-message at n, or nil when it is not set (the Go generated code's
// nil pointer).
func getMessage(m protoreflect.Message, n protoreflect.FieldNumber) protoreflect.Message {
	fd := field(m, n)
	if !m.Has(fd) {
		return nil
	}
	return m.Get(fd).Message()
}

func getList(m protoreflect.Message, n protoreflect.FieldNumber) protoreflect.List {
	return m.Get(field(m, n)).List()
}

func getMapKeys(m protoreflect.Message, n protoreflect.FieldNumber) []string {
	var keys []string
	m.Get(field(m, n)).Map().Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k.String())
		return true
	})
	sort.Strings(keys)
	return keys
}
