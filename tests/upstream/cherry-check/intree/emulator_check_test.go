// The in-tree provider's own REST client (cluster-autoscaler's cloudprovider/cherryservers,
// CA_VERSION in ../../versions.env) against the Cherry Servers emulator. tests/upstream/build.sh
// builds this file as a test of that package: it copies the package's non-test files, unmodified,
// from the extracted CA tree next to this file in a scratch directory, so the test can set the
// manager's baseURL (a field, hard-coded to https://api.cherryservers.com/v1/ otherwise) the way
// the provider's own tests do (cherry_manager_rest_test.go newTestCherryManagerRest).
package cherryservers

import (
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	apiv1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestEmulator reads the template (plans), scales out, lists, finds a node's group by its
// server, scales in, and reads a refused order, as cluster-autoscaler would. It is skipped
// unless CHERRY_CHECK_URL names the API base (ending in /v1/).
func TestEmulator(t *testing.T) {
	base := os.Getenv("CHERRY_CHECK_URL")
	if base == "" {
		t.Skip("CHERRY_CHECK_URL is not set")
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("CHERRY_CHECK_URL: %v", err)
	}
	project, err := strconv.Atoi(os.Getenv("CHERRY_CHECK_PROJECT"))
	if err != nil {
		t.Fatalf("CHERRY_CHECK_PROJECT: %v", err)
	}
	plan, planName := os.Getenv("CHERRY_CHECK_PLAN"), os.Getenv("CHERRY_CHECK_PLAN_NAME")
	memory, _ := strconv.ParseInt(os.Getenv("CHERRY_CHECK_PLAN_MEMORY"), 10, 64)
	pool := func(plan string) *cherryManagerNodePool {
		return &cherryManagerNodePool{
			clusterName:       "check",
			projectID:         project,
			apiServerEndpoint: "192.0.2.1:6443",
			region:            os.Getenv("CHERRY_CHECK_REGION"),
			plan:              plan,
			os:                "ubuntu_22_04",
			cloudinit:         "IyEvYmluL3NoCmVjaG8ge3suTm9kZUdyb3VwfX0K",
			hostnamePattern:   "k8s-{{.ClusterName}}-{{.NodeGroup}}-{{.RandString8}}",
		}
	}
	m := &cherryManagerRest{
		authToken: os.Getenv("CHERRY_CHECK_TOKEN"),
		baseURL:   u,
		nodePools: map[string]*cherryManagerNodePool{
			"default": pool(plan),
			"intree":  pool(plan),
			"empty":   pool(os.Getenv("CHERRY_CHECK_EMPTY_PLAN")),
		},
	}

	// Template: GET plans, the plan by slug, capacity and labels.
	ng := newCherryNodeGroup(m, "intree", 0, 5, 0, time.Second, 50*time.Millisecond)
	info, err := ng.TemplateNodeInfo()
	if err != nil {
		t.Fatalf("TemplateNodeInfo: %v", err)
	}
	node := info.Node()
	if got := node.Labels[apiv1.LabelInstanceType]; got != planName {
		t.Errorf("template %s = %q, want the plan name %q", apiv1.LabelInstanceType, got, planName)
	}
	if got := node.Status.Capacity.Memory().Value(); got != memory {
		t.Errorf("template memory %d, want %d", got, memory)
	}
	if got := node.Status.Capacity.Cpu().Value(); got <= 0 {
		t.Errorf("template cpu %d", got)
	}
	fmt.Printf("template: %s=%s memory=%d\n", apiv1.LabelInstanceType, node.Labels[apiv1.LabelInstanceType], node.Status.Capacity.Memory().Value())

	// Scale out: list (size), then one POST per server.
	if size, err := m.nodeGroupSize("intree"); err != nil || size != 0 {
		t.Fatalf("nodeGroupSize before: %d, %v", size, err)
	}
	if err := ng.IncreaseSize(2); err != nil {
		t.Fatalf("IncreaseSize(2): %v", err)
	}
	instances, err := ng.Nodes()
	if err != nil || len(instances) != 2 {
		t.Fatalf("Nodes after IncreaseSize(2): %v, %v", instances, err)
	}
	names, err := m.getNodeNames("intree")
	if err != nil || len(names) != 2 {
		t.Fatalf("getNodeNames: %v, %v", names, err)
	}
	for _, name := range names {
		if !strings.HasPrefix(name, "k8s-check-intree-") {
			t.Errorf("hostname %q is not the pattern's", name)
		}
	}
	fmt.Printf("scaled out: %v %v\n", instances, names)

	// A node without the pool label: its group from GET servers/{id}.
	group, err := m.NodeGroupForNode(map[string]string{}, instances[0].Id)
	if err != nil || group != "intree" {
		t.Fatalf("NodeGroupForNode(%s): %q, %v", instances[0].Id, group, err)
	}

	// Scale in: DeleteNodes deletes the server whose hostname is the node's name (DELETE
	// servers/{id}, 204 with a JSON Content-Type, which the client requires).
	victim := &apiv1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: names[0]},
		Spec:       apiv1.NodeSpec{ProviderID: instances[0].Id},
	}
	if err := ng.DeleteNodes([]*apiv1.Node{victim}); err != nil {
		t.Fatalf("DeleteNodes: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		size, err := m.nodeGroupSize("intree")
		if err != nil {
			t.Fatalf("nodeGroupSize after DeleteNodes: %v", err)
		}
		if size == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodeGroupSize after DeleteNodes: %d, want 1", size)
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Println("scaled in: 1 left")

	// A refused order: the error body must decode (a non-JSON body would be "failed to
	// unmarshal"); the status is reported.
	empty := newCherryNodeGroup(m, "empty", 0, 5, 0, time.Second, 50*time.Millisecond)
	err = empty.IncreaseSize(1)
	if err == nil || !strings.Contains(err.Error(), "400") || strings.Contains(err.Error(), "unmarshal") {
		t.Fatalf("IncreaseSize of a plan without stock: %v", err)
	}
	fmt.Printf("no stock: %v\n", err)
}
