// A test of cluster-autoscaler's in-tree alicloud provider (this package's other files are
// copied unmodified from CA's cloudprovider/alicloud by tests/upstream/build.sh), run against the
// sandbox's ESS/ECS emulator by tests/alicloud_api.rs. It builds the provider the way
// BuildAlicloud does (CreateAliCloudManager from the ACCESS_KEY_ID, ACCESS_KEY_SECRET and
// REGION_ID environment variables, a static --nodes spec) and lists, scales out, reads the
// template, deletes a node and scales in through the NodeGroup interface CA's core calls.
//
// The provider's SDK resolves endpoints itself; the ESS and ECS hosts are mapped with the SDK's
// own endpoints.AddEndpointMapping to names that do not resolve (ess.emulator.test,
// ecs.emulator.test) and reached through HTTP_PROXY, the emulator's address: the SDK talks plain
// HTTP with Go's default transport, which honours the proxy variables. Nothing in the provider or
// the SDK is changed. Any error, or an answer the SDK cannot parse, fails the test.
//
// Environment: ALICLOUD_CHECK_GROUP (the scaling group), ALICLOUD_CHECK_INSTANCE_TYPE (the
// group's instance type), plus the provider's own variables and HTTP_PROXY.
package alicloud

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/autoscaler/cluster-autoscaler/cloudprovider/alicloud/alibaba-cloud-sdk-go/sdk/endpoints"
)

func eventually(t *testing.T, what string, check func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ok, state := check()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, state)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestInTreeProviderAgainstTheEmulator(t *testing.T) {
	group := os.Getenv("ALICLOUD_CHECK_GROUP")
	instanceType := os.Getenv("ALICLOUD_CHECK_INSTANCE_TYPE")
	region := os.Getenv("REGION_ID")
	if group == "" || instanceType == "" || region == "" || os.Getenv("HTTP_PROXY") == "" {
		t.Fatal("ALICLOUD_CHECK_GROUP, ALICLOUD_CHECK_INSTANCE_TYPE, REGION_ID and HTTP_PROXY must be set")
	}
	for product, host := range map[string]string{"Ess": "ess.emulator.test", "Ecs": "ecs.emulator.test"} {
		if err := endpoints.AddEndpointMapping(region, product, host); err != nil {
			t.Fatalf("AddEndpointMapping %s: %v", product, err)
		}
	}

	manager, err := CreateAliCloudManager(strings.NewReader(""))
	if err != nil {
		t.Fatalf("CreateAliCloudManager: %v", err)
	}
	provider, err := buildStaticallyDiscoveringProvider(manager, []string{"0:5:" + group}, nil)
	if err != nil {
		t.Fatalf("the --nodes spec (DescribeScalingGroups): %v", err)
	}
	groups := provider.NodeGroups()
	if len(groups) != 1 || groups[0].Id() != group {
		t.Fatalf("NodeGroups: %v", groups)
	}
	ng := groups[0]
	size := func() int {
		n, err := ng.TargetSize()
		if err != nil {
			t.Fatalf("TargetSize: %v", err)
		}
		return n
	}
	nodes := func() []string {
		instances, err := ng.Nodes()
		if err != nil {
			t.Fatalf("Nodes: %v", err)
		}
		ids := make([]string, 0, len(instances))
		for _, i := range instances {
			ids = append(ids, i.Id)
		}
		return ids
	}
	if n := size(); n != 0 {
		t.Fatalf("TargetSize of the empty group: %d", n)
	}

	// Scale out (ScaleWithAdjustment TotalCapacity): two instances, listed once launched.
	if err := ng.IncreaseSize(2); err != nil {
		t.Fatalf("IncreaseSize(2): %v", err)
	}
	if n := size(); n != 2 {
		t.Fatalf("TargetSize after IncreaseSize(2): %d", n)
	}
	eventually(t, "two instances", func() (bool, string) {
		ids := nodes()
		return len(ids) == 2, fmt.Sprint(ids)
	})

	// Template (DescribeScalingConfigurations, DescribeInstanceTypes).
	info, err := ng.TemplateNodeInfo()
	if err != nil {
		t.Fatalf("TemplateNodeInfo: %v", err)
	}
	node := info.Node()
	if got := node.Labels[apiv1.LabelInstanceTypeStable]; got != instanceType {
		t.Fatalf("template instance type %q, want %q", got, instanceType)
	}
	if got := node.Labels[apiv1.LabelTopologyRegion]; got != region {
		t.Fatalf("template region %q, want %q", got, region)
	}
	if node.Status.Capacity.Cpu().Value() <= 0 || node.Status.Capacity.Memory().Value() <= 0 {
		t.Fatalf("template capacity: %v", node.Status.Capacity)
	}

	// NodeGroupForNode and DeleteNodes (RemoveInstances, one instance per call).
	ids := nodes()
	victim := &apiv1.Node{ObjectMeta: metav1.ObjectMeta{Name: "victim"}, Spec: apiv1.NodeSpec{ProviderID: ids[0]}}
	owner, err := provider.NodeGroupForNode(victim)
	if err != nil || owner == nil || owner.Id() != group {
		t.Fatalf("NodeGroupForNode(%s): %v, %v", ids[0], owner, err)
	}
	// Nodes() lists instances still being launched, and ESS refuses removals while that
	// activity runs (ScalingActivityInProgress), which DeleteNodes only logs (it returns nil
	// whatever RemoveInstances answered): call it again, as CA's next loop would, until the
	// instance is gone.
	eventually(t, "the deleted instance gone", func() (bool, string) {
		if err := ng.DeleteNodes([]*apiv1.Node{victim}); err != nil {
			t.Fatalf("DeleteNodes: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		left := nodes()
		return len(left) == 1 && left[0] == ids[1], fmt.Sprint(left)
	})
	if n := size(); n != 1 {
		t.Fatalf("TargetSize after DeleteNodes: %d", n)
	}

	// DecreaseTargetSize may only drop what has not launched: with every instance listed the
	// provider refuses it ("attempt to delete existing nodes").
	if err := ng.DecreaseTargetSize(-1); err == nil {
		t.Fatalf("DecreaseTargetSize(-1) below the instances listed succeeded")
	}
	if n := size(); n != 1 {
		t.Fatalf("TargetSize after a refused DecreaseTargetSize: %d", n)
	}
}
