// cherry-check drives a Cherry Servers API (the sandbox's emulator) with cherrygo v4.2.0, the
// official Go client, through the calls a node pool makes: read the plans, scale out (create
// servers with the in-tree provider's tags), list, get, scale in (delete), and the refusals
// (an unknown plan, an order the stock cannot fill). Any answer cherrygo cannot decode, or that
// contradicts what was asked, ends it with exit status 1 and the reason on stderr.
//
// The emulator is reached by cherrygo's own base-URL option (cherrygo.WithURL): the client
// sends its usual paths (/v1/plans, /v1/projects/{id}/servers, ...) to the given host.
//
//	cherry-check -url http://127.0.0.1:PORT -token TOKEN -project 10001 -plan e5_1620v4 \
//	    -region eu_nord_1 -count 2 -empty-plan e3_1240v3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/cherryservers/cherrygo/v4"
)

func main() {
	url := flag.String("url", "", "API base (scheme://host:port; cherrygo adds /v1/...)")
	token := flag.String("token", "", "API token")
	project := flag.Int("project", 0, "project id")
	plan := flag.String("plan", "", "plan slug with stock in -region")
	region := flag.String("region", "", "region slug")
	count := flag.Int("count", 2, "servers to create (scale out)")
	emptyPlan := flag.String("empty-plan", "", "plan slug with no stock left in -region")
	flag.Parse()
	if err := run(*url, *token, *project, *plan, *region, *count, *emptyPlan); err != nil {
		fmt.Fprintf(os.Stderr, "cherry-check: %v\n", err)
		os.Exit(1)
	}
}

func run(url, token string, project int, plan, region string, count int, emptyPlan string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := cherrygo.NewClient(cherrygo.WithURL(url), cherrygo.WithAPIKey(token))
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}

	// Plans: the template a node group is built from.
	plans, _, err := client.Plans.List(ctx, 0, &cherrygo.GetOptions{})
	if err != nil {
		return fmt.Errorf("Plans.List: %w", err)
	}
	p, ok := findPlan(plans, plan)
	if !ok {
		return fmt.Errorf("Plans.List: no plan %q among %d", plan, len(plans))
	}
	if p.Name == "" || p.Specs.CPUs.Cores <= 0 || p.Specs.Memory.Total <= 0 {
		return fmt.Errorf("plan %q: name %q, %d cores, memory %d %s", plan, p.Name, p.Specs.CPUs.Cores, p.Specs.Memory.Total, p.Specs.Memory.Unit)
	}
	switch p.Specs.Memory.Unit {
	case "KB", "MB", "GB", "TB":
	default:
		return fmt.Errorf("plan %q: memory unit %q is not one cluster-autoscaler knows", plan, p.Specs.Memory.Unit)
	}
	stock, ok := stockIn(p, region)
	if !ok || stock.StockQty < count {
		return fmt.Errorf("plan %q in region %q: stock %+v, want at least %d", plan, region, stock, count)
	}
	fmt.Printf("plans: %d; %s (%s): %d cores, %d %s, stock_qty %d, spot_qty %d in %s\n",
		len(plans), p.Slug, p.Name, p.Specs.CPUs.Cores, p.Specs.Memory.Total, p.Specs.Memory.Unit,
		stock.StockQty, stock.SpotQty, region)

	// Scale out: servers with the in-tree provider's tags.
	tags := map[string]string{"k8s-cluster": "check", "k8s-nodepool": "cherrygo"}
	var created []cherrygo.Server
	for i := 0; i < count; i++ {
		hostname := fmt.Sprintf("check-cherrygo-%d", i)
		s, _, err := client.Servers.Create(ctx, &cherrygo.CreateServer{
			ProjectID: project, Plan: plan, Region: region, Hostname: hostname,
			Image: "ubuntu_22_04", Tags: &tags, UserData: "IyEvYmluL3NoCg==",
		})
		if err != nil {
			return fmt.Errorf("Servers.Create %s: %w", hostname, err)
		}
		if s.ID <= 0 || s.Hostname != hostname || s.Plan.Slug != plan || s.Region.Slug != region ||
			s.Tags["k8s-nodepool"] != "cherrygo" || s.Project.ID != project {
			return fmt.Errorf("Servers.Create %s answered id %d hostname %q plan %q region %q tags %v project %d",
				hostname, s.ID, s.Hostname, s.Plan.Slug, s.Region.Slug, s.Tags, s.Project.ID)
		}
		created = append(created, s)
	}
	fmt.Printf("created: %d servers\n", len(created))

	// List and get.
	servers, resp, err := client.Servers.List(ctx, project, &cherrygo.GetOptions{})
	if err != nil {
		return fmt.Errorf("Servers.List: %w", err)
	}
	if resp.Total != len(servers) {
		return fmt.Errorf("Servers.List: X-Total-Count %d, %d servers", resp.Total, len(servers))
	}
	for _, c := range created {
		if !hasServer(servers, c.ID) {
			return fmt.Errorf("Servers.List: server %d missing", c.ID)
		}
		got, _, err := client.Servers.Get(ctx, c.ID, &cherrygo.GetOptions{})
		if err != nil {
			return fmt.Errorf("Servers.Get %d: %w", c.ID, err)
		}
		if got.ID != c.ID || got.Hostname != c.Hostname || got.State == "" {
			return fmt.Errorf("Servers.Get %d answered id %d hostname %q state %q", c.ID, got.ID, got.Hostname, got.State)
		}
	}
	page, resp, err := client.Servers.List(ctx, project, &cherrygo.GetOptions{Limit: 1})
	if err != nil || len(page) != 1 || resp.Total != len(servers) {
		return fmt.Errorf("Servers.List limit 1: %d servers, X-Total-Count %v, %v", len(page), resp, err)
	}
	fmt.Printf("listed: %d servers (X-Total-Count %d)\n", len(servers), resp.Total)

	// Scale in.
	for _, c := range created {
		if _, err := client.Servers.Delete(ctx, c.ID); err != nil {
			return fmt.Errorf("Servers.Delete %d: %w", c.ID, err)
		}
	}
	servers, _, err = client.Servers.List(ctx, project, &cherrygo.GetOptions{})
	if err != nil {
		return fmt.Errorf("Servers.List after deletes: %w", err)
	}
	for _, c := range created {
		for _, s := range servers {
			if s.ID == c.ID && s.State != "terminating" {
				return fmt.Errorf("server %d still listed as %q after its delete", c.ID, s.State)
			}
		}
	}
	fmt.Printf("deleted: %d servers\n", len(created))

	// Refusals: the error body cherrygo reads ({"code": ..., "message": ...}).
	_, _, err = client.Servers.Create(ctx, &cherrygo.CreateServer{ProjectID: project, Plan: "no_such_plan", Region: region})
	if err == nil || !strings.HasPrefix(err.Error(), "error response from API: ") || !strings.HasSuffix(err.Error(), "(error code: 400)") {
		return fmt.Errorf("Servers.Create of an unknown plan: %v", err)
	}
	fmt.Printf("unknown plan: %v\n", err)
	if emptyPlan != "" {
		_, _, err = client.Servers.Create(ctx, &cherrygo.CreateServer{ProjectID: project, Plan: emptyPlan, Region: region})
		if err == nil || !strings.HasPrefix(err.Error(), "error response from API: ") {
			return fmt.Errorf("Servers.Create of a plan without stock: %v", err)
		}
		plans, _, perr := client.Plans.List(ctx, 0, &cherrygo.GetOptions{})
		if perr != nil {
			return fmt.Errorf("Plans.List: %w", perr)
		}
		e, ok := findPlan(plans, emptyPlan)
		if !ok {
			return fmt.Errorf("Plans.List: no plan %q", emptyPlan)
		}
		if s, ok := stockIn(e, region); ok && s.StockQty > 0 {
			return fmt.Errorf("plan %q refused with stock_qty %d in %s", emptyPlan, s.StockQty, region)
		}
		fmt.Printf("no stock: %v\n", err)
	}
	fmt.Println("ok")
	return nil
}

func findPlan(plans []cherrygo.Plan, slug string) (cherrygo.Plan, bool) {
	for _, p := range plans {
		if p.Slug == slug {
			return p, true
		}
	}
	return cherrygo.Plan{}, false
}

func stockIn(p cherrygo.Plan, region string) (cherrygo.AvailableRegions, bool) {
	for _, r := range p.AvailableRegions {
		if r.Region != nil && r.Region.Slug == region {
			return r, true
		}
	}
	return cherrygo.AvailableRegions{}, false
}

func hasServer(servers []cherrygo.Server, id int) bool {
	for _, s := range servers {
		if s.ID == id {
			return true
		}
	}
	return false
}
