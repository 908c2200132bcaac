//! The operator against CA 1.36.1's in-tree `clusterapi` provider, answer by answer.
//!
//! `clusterapi-diff` (tests/upstream/clusterapi-diff, built by `tests/upstream/build.sh
//! clusterapi-diff`) builds both providers as cluster-autoscaler's main builds them, from CA's own
//! flags: the in-tree `cloudprovider/clusterapi` package, unmodified, on this control plane with
//! the same auto-discovery spec as the operator's, and CA's `externalgrpc` client talking to the
//! operator over mTLS. It asks both the same questions (NodeGroups with min and max, TargetSize,
//! Nodes, TemplateNodeInfo, GetOptions with CA's default options, NodeGroupForNode for every Node
//! of this test) and prints both sets of answers.
//!
//! A scripted history runs in one namespace: MachineDeployments, MachineSets and MachinePools
//! with every annotation CA's in-tree unit tests use (`clusterapi_*_test.go`) and edge values
//! (whitespace, out-of-range and negative integers, empty values, bad quantities), scaling, a
//! failed Machine, a deleted Machine, a Machine registered before `nodeRef`, an orphaned Machine,
//! a Node found through Cluster API's annotations, a template without `status.nodeInfo`,
//! annotation edits, `spec.replicas` unset, a paused group with an invalid bound, and an
//! auto-discovery spec with a label. After each
//! step every answer of one side is compared with the other's; every difference must be explained
//! by a row of the behaviour-difference table of docs/migration.md ([`ROWS`], matched by the
//! row's id), and every row whose test column names this file must explain at least one
//! difference of the history. A difference without a row, a row without its difference, or a row
//! id missing from docs/migration.md fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::*;
use kube::ResourceExt;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use ngo_service::server::tls::TlsFiles;
use ngo_testbed::pki::CertificateAuthority;
use nodegroup_operator::runtime::{self, Running};
use serde_json::{Value, json};

const CAPACITY: &str = "capacity.cluster-autoscaler.kubernetes.io/";
const OPTIONS: &str = "cluster.x-k8s.io/autoscaling-options-";
const PAUSED: &str = "cluster.x-k8s.io/paused";
const INT32_MAX: i64 = i32::MAX as i64;

// ----- the answers -----------------------------------------------------------------------------

/// Which question an answer is to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Question {
    /// Whether `NodeGroups` lists the group.
    Listed,
    MinSize,
    MaxSize,
    TargetSize,
    /// One instance of `Nodes`, by machine (`<ns>_<name>` of a synthetic id) or provider ID.
    Instance,
    /// `Nodes` failed on one side.
    Nodes,
    /// `TemplateNodeInfo` answered on one side only, or one field of the template node.
    Template,
    /// `GetOptions`: UNIMPLEMENTED against a reply, or one option.
    Options,
    NodeGroupForNode,
}

/// One answer that differs.
#[derive(Debug)]
struct Difference {
    question: Question,
    /// The group id or node name, with the instance, template field or option when one.
    subject: String,
    /// The group the answer is about (for NodeGroupForNode: none).
    group: Option<String>,
    intree: Value,
    operator: Value,
}

/// Both sides' answers and the objects they were given, for the rows to judge a difference.
struct Context {
    intree: Value,
    operator: Value,
    /// CA's default options, as both providers got them.
    defaults: Value,
    /// Scalable resources by group id, and Machines by name, as the API server has them.
    resources: BTreeMap<String, DynamicObject>,
    machines: BTreeMap<String, DynamicObject>,
    /// Labels the auto-discovery spec requires.
    discovery_labels: BTreeMap<String, String>,
}

impl Context {
    fn intree_group(&self, id: &str) -> Option<&Value> {
        group_of(&self.intree, id)
    }

    fn annotations(&self, group: &str) -> BTreeMap<String, String> {
        self.resources
            .get(group)
            .map(|r| r.annotations().clone())
            .unwrap_or_default()
    }

    /// The Machine with this provider ID, or named by this synthetic id's `<ns>_<name>`.
    fn machine(&self, key: &str) -> Option<&DynamicObject> {
        if let Some((_, name)) = key.split_once('_')
            && let Some(m) = self.machines.get(name)
        {
            return Some(m);
        }
        self.machines
            .values()
            .find(|m| m.data["spec"]["providerID"].as_str() == Some(key))
    }
}

fn group_of<'a>(side: &'a Value, id: &str) -> Option<&'a Value> {
    side["groups"]
        .as_array()?
        .iter()
        .find(|g| g["id"].as_str() == Some(id))
}

/// An answer as CA's core tells answers apart: the value, or whether the error is
/// `ErrNotImplemented` (the texts differ by construction: Go errors against gRPC statuses).
fn normalized(answer: &Value) -> Value {
    match answer.get("error") {
        Some(e) if e["notImplemented"] == true => json!("<ErrNotImplemented>"),
        Some(_) => json!("<error>"),
        None => answer["value"].clone(),
    }
}

fn is_error(v: &Value) -> bool {
    v == "<error>"
}

/// Every answer compared: the number of answers compared, and those that differ.
fn compare(ctx: &Context) -> (usize, Vec<Difference>) {
    let mut compared = 0;
    let mut out = Vec::new();
    let mut diff =
        |question, subject: String, group: Option<&str>, intree: Value, operator: Value| {
            if intree != operator {
                out.push(Difference {
                    question,
                    subject,
                    group: group.map(String::from),
                    intree,
                    operator,
                });
            }
        };
    let ids: BTreeSet<&str> = [&ctx.intree, &ctx.operator]
        .iter()
        .flat_map(|s| s["groups"].as_array().into_iter().flatten())
        .filter_map(|g| g["id"].as_str())
        .collect();
    for id in ids {
        let (a, b) = (group_of(&ctx.intree, id), group_of(&ctx.operator, id));
        compared += 1;
        let (Some(a), Some(b)) = (a, b) else {
            diff(
                Question::Listed,
                id.into(),
                Some(id),
                json!(a.is_some()),
                json!(b.is_some()),
            );
            continue;
        };
        for (q, field) in [(Question::MinSize, "min"), (Question::MaxSize, "max")] {
            compared += 1;
            diff(q, id.into(), Some(id), a[field].clone(), b[field].clone());
        }
        compared += 1;
        diff(
            Question::TargetSize,
            id.into(),
            Some(id),
            normalized(&a["targetSize"]),
            normalized(&b["targetSize"]),
        );
        // Nodes: instance by instance, keyed by machine (synthetic ids) or provider ID.
        let (na, nb) = (normalized(&a["nodes"]), normalized(&b["nodes"]));
        compared += 1;
        match (na.as_array(), nb.as_array()) {
            (Some(ia), Some(ib)) => {
                let by_key = |list: &Vec<Value>| -> BTreeMap<String, Value> {
                    list.iter()
                        .map(|i| {
                            (
                                instance_key(i["id"].as_str().unwrap_or_default()),
                                i.clone(),
                            )
                        })
                        .collect()
                };
                let (ka, kb) = (by_key(ia), by_key(ib));
                let keys: BTreeSet<&String> = ka.keys().chain(kb.keys()).collect();
                for k in keys {
                    diff(
                        Question::Instance,
                        format!("{id} {k}"),
                        Some(id),
                        ka.get(k).cloned().unwrap_or(Value::Null),
                        kb.get(k).cloned().unwrap_or(Value::Null),
                    );
                }
            }
            _ => diff(Question::Nodes, id.into(), Some(id), na, nb),
        }
        // TemplateNodeInfo: field by field when both sides have one.
        let (ta, tb) = (normalized(&a["template"]), normalized(&b["template"]));
        compared += 1;
        if ta.is_object() && tb.is_object() {
            let (la, lb) = (&ta["labels"], &tb["labels"]);
            let keys: BTreeSet<&String> = [la, lb]
                .iter()
                .flat_map(|l| l.as_object().into_iter().flat_map(|m| m.keys()))
                .collect();
            for key in keys {
                diff(
                    Question::Template,
                    format!("{id} labels {key}"),
                    Some(id),
                    la[key].clone(),
                    lb[key].clone(),
                );
            }
            for field in ["taints", "capacity", "allocatable", "podsMilliCPU"] {
                diff(
                    Question::Template,
                    format!("{id} {field}"),
                    Some(id),
                    ta[field].clone(),
                    tb[field].clone(),
                );
            }
        } else {
            diff(Question::Template, id.into(), Some(id), ta, tb);
        }
        // GetOptions: a reply against UNIMPLEMENTED (CA then keeps its defaults), and option
        // by option against what CA ends up with.
        let (oa, ob) = (normalized(&a["options"]), normalized(&b["options"]));
        compared += 1;
        let effective = |o: &Value| {
            if o == "<ErrNotImplemented>" {
                ctx.defaults.clone()
            } else {
                o.clone()
            }
        };
        if oa.is_object() != ob.is_object() && (oa.is_object() || ob.is_object()) {
            let unimplemented = |o: &Value| json!(o == "<ErrNotImplemented>");
            diff(
                Question::Options,
                id.into(),
                Some(id),
                unimplemented(&oa),
                unimplemented(&ob),
            );
        }
        let (ea, eb) = (effective(&oa), effective(&ob));
        if ea.is_object() && eb.is_object() {
            for (field, va) in ea.as_object().into_iter().flatten() {
                diff(
                    Question::Options,
                    format!("{id} {field}"),
                    Some(id),
                    va.clone(),
                    eb[field].clone(),
                );
            }
        } else {
            diff(Question::Options, id.into(), Some(id), ea, eb);
        }
    }
    let nodes: BTreeSet<&String> = ctx.intree["nodeGroupForNode"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.keys())
        .collect();
    for node in nodes {
        compared += 1;
        diff(
            Question::NodeGroupForNode,
            node.clone(),
            None,
            normalized(&ctx.intree["nodeGroupForNode"][node]),
            normalized(&ctx.operator["nodeGroupForNode"][node]),
        );
    }
    (compared, out)
}

/// The machine a synthetic instance id names (`<ns>_<name>`), else the provider ID itself.
fn instance_key(id: &str) -> String {
    for prefix in ["pending-machine-", "failed-machine-", "deleting-machine-"] {
        if let Some(rest) = id.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    id.to_string()
}

// ----- the rows of docs/migration.md -----------------------------------------------------------

/// A row of the behaviour-difference table, as this test recognises its difference.
struct Row {
    id: &'static str,
    explains: fn(&Difference, &Context) -> bool,
    /// The history shows the difference every run (false: only in some of in-tree's listing
    /// orders, which come from Go map iteration).
    always: bool,
}

fn is_i32_max_exceeded(v: &Value) -> bool {
    v["max"].as_i64().is_some_and(|m| m > INT32_MAX)
        || v["min"].as_i64().is_some_and(|m| m > INT32_MAX)
}

/// A bound annotation the in-tree provider rejects (`parseScalingBounds`: `strconv.Atoi`, < 0,
/// max < min).
fn bad_bound(annotations: &BTreeMap<String, String>) -> bool {
    // A missing bound reads as 0 there.
    let parse = |key: &str| annotations.get(key).map_or(Ok(0), |v| v.parse::<i64>());
    match (parse(MIN), parse(MAX)) {
        (Ok(min), Ok(max)) => min < 0 || max < 0 || max < min,
        _ => true,
    }
}

fn trims_to_valid_bounds(annotations: &BTreeMap<String, String>) -> bool {
    [MIN, MAX].iter().any(|k| {
        annotations
            .get(*k)
            .is_some_and(|v| v.trim() != v && v.trim().parse::<i32>().is_ok_and(|n| n >= 0))
    })
}

/// The group a node's machine belongs to in this namespace's objects (for NodeGroupForNode
/// differences): the resource id the test meant it for.
fn node_machine<'a>(d: &Difference, ctx: &'a Context) -> Option<&'a DynamicObject> {
    // Nodes are named `<ns>-<machine>` with provider ID `test:////<ns>-<machine>`.
    let pid = format!("test:////{}", d.subject);
    ctx.machines.values().find(|m| {
        m.data["status"]["nodeRef"]["name"].as_str() == Some(d.subject.as_str())
            || m.data["spec"]["providerID"].as_str() == Some(pid.as_str())
    })
}

fn group_annotations_of_node(d: &Difference, ctx: &Context) -> BTreeMap<String, String> {
    // The node's group is named by whichever side names one; else by its machine's owner.
    for v in [&d.intree, &d.operator] {
        if let Some(id) = v["id"].as_str() {
            return ctx.annotations(id);
        }
    }
    let Some(m) = node_machine(d, ctx) else {
        return BTreeMap::new();
    };
    let Some(set) = m.owner_references().first().map(|o| o.name.clone()) else {
        return BTreeMap::new();
    };
    let md = ctx
        .resources
        .values()
        .find(|r| r.name_any() == set && r.types.as_ref().is_some_and(|t| t.kind == "MachineSet"))
        .and_then(|ms| ms.owner_references().first().map(|o| o.name.clone()));
    let id = match md {
        Some(md) => format!(
            "MachineDeployment/{}/{md}",
            m.namespace().unwrap_or_default()
        ),
        None => format!("MachineSet/{}/{set}", m.namespace().unwrap_or_default()),
    };
    ctx.annotations(&id)
}

/// The label a template difference is about.
fn label_key(d: &Difference) -> Option<&str> {
    (d.question == Question::Template)
        .then(|| d.subject.split_once(" labels ").map(|(_, k)| k))
        .flatten()
}

fn option_field(d: &Difference) -> &str {
    d.subject
        .rsplit_once(' ')
        .map(|(_, f)| f)
        .unwrap_or_default()
}

fn capacity_annotation_unparsable(a: &BTreeMap<String, String>) -> bool {
    ["cpu", "memory", "ephemeral-disk"].iter().any(|k| {
        a.get(&format!("{CAPACITY}{k}"))
            .is_some_and(|v| !v.is_empty() && !is_quantity(v))
    }) || ["gpu-count", "maxPods"].iter().any(|k| {
        a.get(&format!("{CAPACITY}{k}"))
            .is_some_and(|v| !v.is_empty() && v.parse::<i64>().is_err())
    })
}

/// A Kubernetes quantity as `resource.ParseQuantity` reads it (enough for the corpus: digits,
/// an optional fraction and sign, one of the suffixes).
fn is_quantity(v: &str) -> bool {
    let digits = v.trim_start_matches(['-', '+']);
    let number_end = digits
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(digits.len());
    let suffix = &digits[number_end..];
    number_end > 0
        && [
            "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
        ]
        .contains(&suffix)
}

fn negative_capacity(a: &BTreeMap<String, String>) -> bool {
    ["cpu", "memory", "ephemeral-disk", "gpu-count", "maxPods"]
        .iter()
        .any(|k| {
            a.get(&format!("{CAPACITY}{k}"))
                .is_some_and(|v| v.starts_with('-'))
        })
}

/// The rows of docs/migration.md's behaviour-difference table this test shows, each with how its
/// difference looks in the answers.
const ROWS: &[Row] = &[
    // D1: an invalid bound (not an integer, negative, max < min): in-tree's NodeGroups lists no
    // group at all and its NodeGroupForNode fails for that resource's nodes; we leave out that
    // resource only.
    Row {
        id: "D1",
        always: true,
        explains: |d, ctx| match d.question {
            Question::Listed => {
                d.operator == true
                    && ctx.intree["groups"]
                        .as_array()
                        .is_some_and(|g| g.is_empty())
                    && ctx.resources.values().any(|r| bad_bound(r.annotations()))
            }
            Question::NodeGroupForNode => {
                is_error(&d.intree)
                    && d.operator.is_null()
                    && bad_bound(&group_annotations_of_node(d, ctx))
            }
            _ => false,
        },
    },
    // D2: bounds with surrounding whitespace are read (trimmed); in-tree's strconv.Atoi rejects
    // them (D1's consequences).
    Row {
        id: "D2",
        always: true,
        explains: |d, ctx| {
            d.question == Question::NodeGroupForNode
                && is_error(&d.intree)
                && d.operator.is_object()
                && trims_to_valid_bounds(&group_annotations_of_node(d, ctx))
        },
    },
    // D3: a bound beyond 2^31-1 is invalid here (the protocol's sizes are int32); in-tree reads
    // it as a Go int.
    Row {
        id: "D3",
        always: true,
        explains: |d, _| {
            d.question == Question::NodeGroupForNode
                && is_i32_max_exceeded(&d.intree)
                && d.operator.is_null()
        },
    },
    // D4: spec.replicas unset: in-tree serves the group and its TargetSize fails (which fails
    // every loop of CA: clusterstate's UpdateNodes); we leave it out.
    Row {
        id: "D4",
        always: true,
        explains: |d, ctx| {
            let unset = |id: &str| {
                ctx.resources
                    .get(id)
                    .is_some_and(|r| r.data["spec"].get("replicas").is_none())
                    && ctx
                        .intree_group(id)
                        .is_none_or(|g| is_error(&normalized(&g["targetSize"])))
            };
            match d.question {
                Question::Listed => {
                    d.intree == true && unset(d.group.as_deref().unwrap_or_default())
                }
                Question::NodeGroupForNode => {
                    d.operator.is_null() && d.intree["id"].as_str().is_some_and(unset)
                }
                _ => false,
            }
        },
    },
    // D5: GetOptions of a group without (valid, carried) overrides: UNIMPLEMENTED, CA keeps its
    // defaults; in-tree returns the defaults.
    Row {
        id: "D5",
        always: true,
        explains: |d, _| {
            // The whole answer (a field's difference names the field after the group id).
            d.question == Question::Options
                && !d.subject.contains(' ')
                && d.intree == false
                && d.operator == true
        },
    },
    // D6: maxNodeStartupTime: no protocol field. Any options reply makes CA >= 1.35 use 0 for the
    // group; an override is not carried.
    Row {
        id: "D6",
        always: true,
        explains: |d, _| d.question == Question::Options && option_field(d) == "maxNodeStartupTime",
    },
    // D7: the ignoredaemonsetsutilization and zeroormaxnodescaling annotations are read; in-tree's
    // GetOptions does not read them.
    Row {
        id: "D7",
        always: true,
        explains: |d, ctx| {
            let field = option_field(d);
            let key = match field {
                "ignoreDaemonSetsUtilization" => "ignoredaemonsetsutilization",
                "zeroOrMaxNodeScaling" => "zeroormaxnodescaling",
                _ => return false,
            };
            d.question == Question::Options
                && d.group
                    .as_deref()
                    .is_some_and(|g| ctx.annotations(g).contains_key(&format!("{OPTIONS}{key}")))
        },
    },
    // D8: a utilization threshold outside [0,1] or a negative duration is ignored (warning);
    // in-tree passes it to CA.
    Row {
        id: "D8",
        always: true,
        explains: |d, ctx| {
            let field = option_field(d);
            let out_of_range = match field {
                "scaleDownUtilizationThreshold" | "scaleDownGpuUtilizationThreshold" => {
                    d.intree.as_f64().is_some_and(|v| !(0.0..=1.0).contains(&v))
                }
                "scaleDownUnneededTime" | "scaleDownUnreadyTime" | "maxNodeProvisionTime" => {
                    d.intree.as_str().is_some_and(|v| v.starts_with('-'))
                }
                _ => false,
            };
            d.question == Question::Options && out_of_range && d.operator == ctx.defaults[field]
        },
    },
    // D9: the template NodeInfo carries no kube-proxy pod (externalgrpc's TemplateNodeInfo
    // returns a Node only); in-tree's reserves 100m CPU for it.
    Row {
        id: "D9",
        always: true,
        explains: |d, _| {
            d.question == Question::Template
                && d.subject.ends_with(" podsMilliCPU")
                && d.intree == 100
                && d.operator == 0
        },
    },
    // D10: an unparsable cpu/memory/ephemeral-disk quantity or gpu-count/maxPods integer is
    // ignored (warning), the rest of the template applies; in-tree's InstanceCapacity fails: no
    // template (ErrNotImplemented).
    Row {
        id: "D10",
        always: true,
        explains: |d, ctx| {
            d.question == Question::Template
                && d.intree == "<ErrNotImplemented>"
                && d.operator.is_object()
                && d.group
                    .as_deref()
                    .is_some_and(|g| capacity_annotation_unparsable(&ctx.annotations(g)))
        },
    },
    // D11: a negative capacity is ignored (warning); in-tree puts it into the template node.
    Row {
        id: "D11",
        always: true,
        explains: |d, ctx| {
            d.question == Question::Template
                && (d.subject.ends_with(" capacity") || d.subject.ends_with(" allocatable"))
                && d.intree.as_object().is_some_and(|c| {
                    c.values()
                        .any(|v| v.as_str().is_some_and(|s| s.starts_with('-')))
                })
                && d.group
                    .as_deref()
                    .is_some_and(|g| negative_capacity(&ctx.annotations(g)))
        },
    },
    // D12: labels and taints annotation items are trimmed; in-tree keeps the spaces in a label's
    // key and value and skips a taint with spaces.
    Row {
        id: "D12",
        always: true,
        explains: |d, ctx| {
            let spaced = |key: &str| {
                d.group.as_deref().is_some_and(|g| {
                    ctx.annotations(g)
                        .get(&format!("{CAPACITY}{key}"))
                        .is_some_and(|v| {
                            v.split(',').any(|item| {
                                item.trim() != item || item.contains(" =") || item.contains("= ")
                            })
                        })
                })
            };
            // A label key that comes from the annotation (with its spaces, on either side).
            let from_annotation = label_key(d).is_some_and(|k| {
                d.group.as_deref().is_some_and(|g| {
                    ctx.annotations(g)
                        .get(&format!("{CAPACITY}labels"))
                        .is_some_and(|v| v.contains(k))
                })
            });
            d.question == Question::Template
                && ((from_annotation && spaced("labels"))
                    || (d.subject.ends_with(" taints") && spaced("taints")))
        },
    },
    // D13: failed Machines of v1beta2: status.deprecated.v1beta1.failureMessage is read (failed,
    // with its error); in-tree reads only status.failureMessage, which v1beta2 has not: pending.
    Row {
        id: "D13",
        always: true,
        explains: |d, _| {
            d.question == Question::Instance
                && d.intree["id"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("pending-machine-"))
                && d.operator["id"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("failed-machine-"))
                && d.operator["errorCode"] == "ProvisioningFailed"
        },
    },
    // D14: a Machine whose Node registered before Cluster API set nodeRef is running (its
    // provider ID); in-tree reports it pending.
    Row {
        id: "D14",
        always: true,
        explains: |d, ctx| {
            if d.question != Question::Instance {
                return false;
            }
            let key = d
                .subject
                .rsplit_once(' ')
                .map(|(_, k)| k)
                .unwrap_or_default();
            let Some(m) = ctx.machine(key) else {
                return false;
            };
            let no_node_ref = m.data["status"]["nodeRef"].is_null();
            let pid = m.data["spec"]["providerID"].as_str();
            no_node_ref
                && pid.is_some()
                && ((d.intree["id"]
                    .as_str()
                    .is_some_and(|i| i.starts_with("pending-machine-"))
                    && d.operator.is_null())
                    || (d.intree.is_null()
                        && d.operator["id"].as_str() == pid
                        && d.operator["state"] == "Running"))
        },
    },
    // D15: a group's Machines are those its MachineSets own (owner references, as Cluster API's
    // controllers and in-tree's own NodeGroupForNode decide); in-tree's Nodes takes every
    // Machine of the namespace matching spec.selector and the cluster name.
    Row {
        id: "D15",
        always: true,
        explains: |d, ctx| {
            d.question == Question::Instance
                && d.operator.is_null()
                && d.intree["id"]
                    .as_str()
                    .and_then(|pid| ctx.machine(pid))
                    .is_some_and(|m| m.owner_references().is_empty())
        },
    },
    // D16: auto-discovery labels select the node group; the MachineSet a node's Machine belongs
    // to need not carry them. In-tree's findMachineSet filters it by the spec too, so the nodes
    // of a served MachineDeployment map to no group.
    Row {
        id: "D16",
        always: true,
        explains: |d, ctx| {
            if d.question != Question::NodeGroupForNode || !d.intree.is_null() {
                return false;
            }
            let Some(id) = d.operator["id"].as_str() else {
                return false;
            };
            let Some(m) = node_machine(d, ctx) else {
                return false;
            };
            let set = m
                .owner_references()
                .first()
                .map(|o| o.name.clone())
                .unwrap_or_default();
            let set_labels = ctx
                .resources
                .values()
                .find(|r| {
                    r.name_any() == set && r.types.as_ref().is_some_and(|t| t.kind == "MachineSet")
                })
                .map(|r| r.labels().clone())
                .unwrap_or_default();
            id.starts_with("MachineDeployment/")
                && !ctx.discovery_labels.is_empty()
                && !ctx
                    .discovery_labels
                    .iter()
                    .all(|(k, v)| set_labels.get(k) == Some(v))
        },
    },
    // D17: the machine template's managed labels (node-role.kubernetes.io/*,
    // node-restriction.kubernetes.io, node.cluster.x-k8s.io) are read from
    // spec.template.metadata.labels, where Cluster API has them; in-tree's Labels() reads
    // spec.template.spec.metadata.labels, which no Cluster API object has.
    Row {
        id: "D17",
        always: true,
        explains: |d, ctx| {
            let Some(key) = label_key(d) else {
                return false;
            };
            let managed = key.split('/').next().is_some_and(|domain| {
                domain == "node-role.kubernetes.io"
                    || domain == "node-restriction.kubernetes.io"
                    || domain.ends_with(".node-restriction.kubernetes.io")
                    || domain == "node.cluster.x-k8s.io"
                    || domain.ends_with(".node.cluster.x-k8s.io")
            });
            managed
                && d.intree.is_null()
                && d.group
                    .as_deref()
                    .and_then(|g| ctx.resources.get(g))
                    .is_some_and(|r| {
                        r.data["spec"]["template"]["metadata"]["labels"][key] == d.operator
                    })
        },
    },
    // D18: the well-known labels of a group's Nodes (arch, os, instance type, region, zone)
    // are copied from a registered Node of the group; in-tree copies them from its first
    // instance only, so not when that one is pending, failed or being deleted.
    Row {
        id: "D18",
        always: false,
        explains: |d, ctx| {
            let Some(key) = label_key(d) else {
                return false;
            };
            let well_known = [
                "kubernetes.io/arch",
                "kubernetes.io/os",
                "node.kubernetes.io/instance-type",
                "beta.kubernetes.io/instance-type",
                "topology.kubernetes.io/region",
                "failure-domain.beta.kubernetes.io/region",
                "failure-domain.beta.kubernetes.io/zone",
            ];
            let first_not_running = d
                .group
                .as_deref()
                .and_then(|g| ctx.intree_group(g))
                .and_then(|g| g["nodes"]["value"].as_array()?.first().cloned())
                .is_some_and(|i| i["state"] != "Running");
            well_known.contains(&key)
                && d.intree.is_null()
                && d.operator.is_string()
                && first_not_running
        },
    },
    // D26: an infrastructure template without `status.nodeInfo`: in-tree's template node gets
    // empty architecture and OS labels (an empty system info overrides the defaults); we keep
    // the defaults.
    Row {
        id: "D26",
        always: true,
        explains: |d, _| {
            matches!(
                label_key(d),
                Some("kubernetes.io/arch" | "kubernetes.io/os")
            ) && d.intree == ""
                && d.operator.as_str().is_some_and(|v| !v.is_empty())
        },
    },
];

// ----- running both providers ------------------------------------------------------------------

/// The operator's mTLS material and CA's cloud-config for it.
struct Pki {
    dir: PathBuf,
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

impl Pki {
    fn new(dir: &Path) -> Self {
        let ca = CertificateAuthority::new("ngo-intree-diff-ca").unwrap();
        let ca_path = dir.join("ca.crt");
        ca.write_cert(&ca_path).unwrap();
        let server = ca
            .issue("nodegroup-operator", &["127.0.0.1", "localhost"], None)
            .unwrap()
            .write(dir, "server")
            .unwrap();
        let client = ca
            .issue("cluster-autoscaler", &[], None)
            .unwrap()
            .write(dir, "client")
            .unwrap();
        Self {
            dir: dir.to_path_buf(),
            ca: ca_path,
            server,
            client,
        }
    }

    /// An operator for `ns` with these auto-discovery specs, serving mTLS.
    async fn operator(&self, ns: &TestNs, discovery: &str) -> Running {
        let tls = TlsFiles {
            cert: self.server.0.clone(),
            key: self.server.1.clone(),
            client_ca: self.ca.clone(),
        };
        let mut config = operator_config(&ns.name, Some(tls));
        config.auto_discovery = vec![discovery.to_string()];
        runtime::start(config).await.expect("operator starts")
    }

    /// CA's externalgrpc cloud-config for `operator`.
    fn cloud_config(&self, operator: &Running) -> PathBuf {
        let address = operator.grpc_address.expect("a TCP listener");
        let config = json!({"address": address.to_string(), "grpc_timeout": "10s",
            "cert": self.client.0, "key": self.client.1, "cacert": self.ca});
        let path = self
            .dir
            .join(format!("cloud-config-{}.yaml", address.port()));
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        path
    }
}

/// Runs `clusterapi-diff` once: both sides' answers, and its log (CA's klog at -v=2).
async fn ask_both(ns: &TestNs, discovery: &str, cloud_config: &Path) -> (Value, String) {
    let bin = ngo_testbed::upstream_check("clusterapi-diff", "clusterapi-diff")
        .unwrap_or_else(|e| panic!("{e}"));
    let mut command = tokio::process::Command::new(bin);
    command
        .arg(format!("--kubeconfig={}", shared().kubeconfig.display()))
        .arg(format!("--node-group-auto-discovery={discovery}"))
        .arg(format!(
            "--externalgrpc-cloud-config={}",
            cloud_config.display()
        ))
        .arg(format!("--node-prefix={}-", ns.name))
        .arg("--kube-client-qps=200")
        .arg("--kube-client-burst=400")
        .arg("-v=2")
        .env("CAPI_VERSION", CAPI_VERSION)
        .kill_on_drop(true);
    let output = command.output().await.expect("clusterapi-diff runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "clusterapi-diff: {}\n{stdout}{stderr}",
        output.status
    );
    let answers = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("clusterapi-diff's output: {e}\n{stdout}"));
    (answers, stderr)
}

/// The namespace's scalable resources by group id, and its Machines by name.
async fn objects(
    ns: &TestNs,
) -> (
    BTreeMap<String, DynamicObject>,
    BTreeMap<String, DynamicObject>,
) {
    let mut resources = BTreeMap::new();
    for (kind, ar) in [
        ("MachineDeployment", machine_deployments()),
        ("MachineSet", machine_sets()),
        ("MachinePool", machine_pools()),
    ] {
        for mut r in ns.api(&ar).list(&Default::default()).await.unwrap().items {
            r.types = Some(kube::core::TypeMeta {
                api_version: format!("cluster.x-k8s.io/{CAPI_VERSION}"),
                kind: kind.into(),
            });
            resources.insert(format!("{kind}/{}/{}", ns.name, r.name_any()), r);
        }
    }
    let machines = ns
        .api(&machines())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|m| (m.name_any(), m))
        .collect();
    (resources, machines)
}

/// What the history has seen so far.
#[derive(Default)]
struct Tally {
    steps: usize,
    compared: usize,
    differences: usize,
    /// Row id -> the differences it explained (their subjects, for the report).
    rows: BTreeMap<&'static str, Vec<String>>,
}

/// After one step of the history: both sides asked until every difference is explained (the
/// operator follows the API server through watches, so a difference may be one it has not seen
/// yet), then the tally.
async fn check_step(
    step: &str,
    ns: &TestNs,
    discovery: &str,
    cloud_config: &Path,
    tally: &mut Tally,
) {
    let discovery_labels: BTreeMap<String, String> = discovery
        .split_once(':')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k != "namespace" && *k != "clusterName")
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let start = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    loop {
        let (answers, log) = ask_both(ns, discovery, cloud_config).await;
        let (resources, machines) = objects(ns).await;
        let ctx = Context {
            intree: answers["intree"].clone(),
            operator: answers["operator"].clone(),
            defaults: answers["defaults"].clone(),
            resources,
            machines,
            discovery_labels: discovery_labels.clone(),
        };
        let (compared, differences) = compare(&ctx);
        let explained: Vec<(Option<&'static str>, &Difference)> = differences
            .iter()
            .map(|d| (ROWS.iter().find(|r| (r.explains)(d, &ctx)).map(|r| r.id), d))
            .collect();
        let unexplained: Vec<&&Difference> = explained
            .iter()
            .filter(|(row, _)| row.is_none())
            .map(|(_, d)| d)
            .collect();
        if unexplained.is_empty() {
            tally.steps += 1;
            tally.compared += compared;
            tally.differences += differences.len();
            for (row, d) in explained {
                eprintln!(
                    "  {} {:?} {}: in-tree {} / operator {}",
                    row.unwrap_or_default(),
                    d.question,
                    d.subject,
                    d.intree,
                    d.operator
                );
                tally
                    .rows
                    .entry(row.unwrap_or_default())
                    .or_default()
                    .push(format!("{step}: {:?} {}", d.question, d.subject));
            }
            eprintln!(
                "step {step:?}: {compared} answers compared, {} differ, all listed",
                differences.len()
            );
            return;
        }
        if start.elapsed() > Duration::from_secs(8) {
            let listing: Vec<String> = unexplained
                .iter()
                .map(|d| {
                    format!(
                        "  {:?} {}: in-tree {} / operator {}",
                        d.question, d.subject, d.intree, d.operator
                    )
                })
                .collect();
            panic!(
                "step {step:?}: {} difference(s) from CA 1.36.1's in-tree clusterapi provider \
                 not listed in docs/migration.md (add a row and its recogniser to ROWS, or fix \
                 the operator):\n{}\n\nin-tree: {:#}\noperator: {:#}\nclusterapi-diff's log:\n{log}",
                unexplained.len(),
                listing.join("\n"),
                ctx.intree,
                ctx.operator
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

// ----- fixtures shaped as Cluster API makes them ----------------------------------------------

struct Objects<'a> {
    ns: &'a TestNs,
}

impl Objects<'_> {
    async fn create(&self, ar: &ApiResource, body: Value) -> DynamicObject {
        let obj: DynamicObject = serde_json::from_value(body).expect("fixture");
        let name = obj.name_any();
        self.ns
            .api(ar)
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating {} {name}: {e}", ar.kind))
    }

    fn template(&self, labels: &Value, infra: &str) -> Value {
        json!({"metadata": {"labels": labels}, "spec": {
            "clusterName": "c1", "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TestMachineTemplate", "name": infra}
        }})
    }

    /// A MachineDeployment (`replicas` unset with `None`) and the MachineSet it owns, labelled
    /// and selected as Cluster API's MachineDeployment controller makes them.
    async fn deployment(
        &self,
        name: &str,
        replicas: Option<i64>,
        annotations: Value,
        infra: &str,
    ) -> DynamicObject {
        let ns = &self.ns.name;
        let selector = json!({"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/deployment-name": name});
        let mut template_labels = selector.clone();
        template_labels["node-role.kubernetes.io/worker"] = json!("");
        let mut spec = json!({"clusterName": "c1", "selector": {"matchLabels": selector},
            "template": self.template(&template_labels, infra)});
        if let Some(r) = replicas {
            spec["replicas"] = json!(r);
        }
        let md = self
            .create(
                &machine_deployments(),
                json!({"apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "MachineDeployment",
                    "metadata": {"name": name, "namespace": ns, "annotations": annotations}, "spec": spec}),
            )
            .await;
        let mut set_labels = template_labels.clone();
        set_labels["cluster.x-k8s.io/set-name"] = json!(format!("{name}-ms"));
        self.create(
            &machine_sets(),
            json!({"apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "MachineSet",
                "metadata": {"name": format!("{name}-ms"), "namespace": ns, "labels": set_labels,
                    "annotations": {"machinedeployment.clusters.x-k8s.io/revision": "1"},
                    "ownerReferences": [owner_ref(&md, "MachineDeployment")]},
                "spec": {"clusterName": "c1", "replicas": replicas.unwrap_or(0),
                    "selector": {"matchLabels": set_labels}, "template": self.template(&set_labels, infra)}}),
        )
        .await
    }

    /// A MachineSet owned by no MachineDeployment.
    /// A `TestMachineTemplate` `name` whose status is `status` (what Cluster API's
    /// infrastructure providers report: capacity, system info).
    async fn infrastructure_template(&self, name: &str, status: Value) {
        let template: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": "TestMachineTemplate",
            "metadata": {"name": name, "namespace": self.ns.name}, "spec": {"template": {"spec": {}}}
        }))
        .unwrap();
        let templates = self.ns.api(&test_machine_templates());
        templates
            .create(&Default::default(), &template)
            .await
            .unwrap();
        templates
            .patch_status(
                name,
                &Default::default(),
                &Patch::Merge(json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    async fn machine_set(&self, name: &str, replicas: i64, annotations: Value) -> DynamicObject {
        let labels =
            json!({"cluster.x-k8s.io/cluster-name": "c1", "cluster.x-k8s.io/set-name": name});
        self.create(
            &machine_sets(),
            json!({"apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "MachineSet",
                "metadata": {"name": name, "namespace": self.ns.name, "annotations": annotations, "labels": labels},
                "spec": {"clusterName": "c1", "replicas": replicas, "selector": {"matchLabels": labels},
                    "template": self.template(&labels, "template")}}),
        )
        .await
    }

    /// A Machine of MachineSet `ms` (its labels, owned by it unless `orphan`), with a Node of
    /// provider ID `test:////<ns>-<name>` when `node`; `node_ref` sets status.nodeRef.
    async fn machine(
        &self,
        name: &str,
        ms: &DynamicObject,
        node: bool,
        node_ref: bool,
        status: Value,
    ) -> String {
        self.machine_with(name, ms, node, node_ref, status, false)
            .await
    }

    async fn machine_with(
        &self,
        name: &str,
        ms: &DynamicObject,
        node: bool,
        node_ref: bool,
        status: Value,
        orphan: bool,
    ) -> String {
        let ns = &self.ns.name;
        let pid = format!("test:////{ns}-{name}");
        let mut spec = json!({"clusterName": "c1", "bootstrap": {"dataSecretName": "none"},
            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TestMachine", "name": name}});
        if node {
            spec["providerID"] = json!(pid);
        }
        let mut metadata = json!({"name": name, "namespace": ns, "labels": ms.labels(), "finalizers": ["test.nodegroup.dev/hold"]});
        if !orphan {
            metadata["ownerReferences"] = json!([owner_ref(ms, "MachineSet")]);
        }
        self.create(
            &machines(),
            json!({"apiVersion": format!("cluster.x-k8s.io/{CAPI_VERSION}"), "kind": "Machine",
                "metadata": metadata, "spec": spec}),
        )
        .await;
        let node_name = format!("{ns}-{name}");
        if node {
            self.ns.node(name, &pid, BTreeMap::new()).await;
        }
        let mut st = status;
        if node_ref {
            st["nodeRef"] = json!({"name": node_name});
        }
        if st.as_object().is_some_and(|o| !o.is_empty()) {
            self.ns
                .api(&machines())
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": st})),
                )
                .await
                .unwrap_or_else(|e| panic!("status of machine {name}: {e}"));
        }
        pid
    }

    async fn patch(&self, ar: &ApiResource, name: &str, patch: Value) {
        self.ns
            .api(ar)
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap_or_else(|e| panic!("patching {} {name}: {e}", ar.kind));
    }

    async fn annotate(&self, ar: &ApiResource, name: &str, annotations: Value) {
        self.patch(ar, name, json!({"metadata": {"annotations": annotations}}))
            .await;
    }
}

fn test_machine_templates() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            "infrastructure.cluster.x-k8s.io",
            "v1alpha1",
            "TestMachineTemplate",
        ),
        "testmachinetemplates",
    )
}

/// The row ids of docs/migration.md's behaviour-difference table, and those whose test column
/// names this file.
fn migration_rows() -> (BTreeSet<String>, BTreeSet<String>) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/migration.md");
    let doc = std::fs::read_to_string(&path).expect("docs/migration.md");
    let mut all = BTreeSet::new();
    let mut here = BTreeSet::new();
    for line in doc.lines() {
        let Some(rest) = line.strip_prefix("| D") else {
            continue;
        };
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() || !rest[digits.len()..].starts_with(" |") {
            continue;
        }
        let id = format!("D{digits}");
        assert!(all.insert(id.clone()), "docs/migration.md: row {id} twice");
        if line.contains("intree_diff") {
            here.insert(id);
        }
    }
    (all, here)
}

#[tokio::test]
async fn every_difference_from_the_in_tree_clusterapi_provider_is_listed() {
    let ns = TestNs::new("intree-diff").await;
    let n = ns.name.clone();
    let o = Objects { ns: &ns };
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let discovery = format!("clusterapi:namespace={n}");

    // The infrastructure template every group names: cpu, memory and the node's system info.
    o.infrastructure_template(
        "template",
        json!({"capacity": {"cpu": "4", "memory": "16Gi"},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"}}),
    )
    .await;

    // Step 1. The corpus of CA's in-tree tests (clusterapi_*_test.go): bounds, replicas, the
    // capacity, labels, taints and autoscaling-options annotations; a MachineSet alone, a
    // MachinePool, a paused group, an unannotated MachineDeployment.
    let workers = o
        .deployment("workers", Some(3), json!({MIN: "1", MAX: "10"}), "template")
        .await;
    o.machine(
        "workers-0",
        &workers,
        true,
        true,
        json!({"phase": "Running"}),
    )
    .await;
    o.machine(
        "workers-1",
        &workers,
        true,
        true,
        json!({"phase": "Running"}),
    )
    .await;
    o.machine(
        "workers-2",
        &workers,
        false,
        false,
        json!({"phase": "Provisioning"}),
    )
    .await;
    o.deployment(
        "zero",
        Some(0),
        json!({MIN: "0", MAX: "3",
            format!("{CAPACITY}cpu"): "2", format!("{CAPACITY}memory"): "2048Mi",
            format!("{CAPACITY}ephemeral-disk"): "100Gi", format!("{CAPACITY}maxPods"): "200",
            format!("{CAPACITY}gpu-type"): "nvidia.com/gpu", format!("{CAPACITY}gpu-count"): "1",
            format!("{CAPACITY}labels"): "key1=value1,key2=value2",
            format!("{CAPACITY}taints"): "key1=value1:NoSchedule,key2=value2:NoExecute"}),
        "template",
    )
    .await;
    o.deployment(
        "options",
        Some(1),
        json!({MIN: "0", MAX: "5",
            format!("{OPTIONS}scaledownutilizationthreshold"): "0.6",
            format!("{OPTIONS}scaledowngpuutilizationthreshold"): "0.7",
            format!("{OPTIONS}scaledownunneededtime"): "1h",
            format!("{OPTIONS}scaledownunreadytime"): "30m",
            format!("{OPTIONS}maxnodeprovisiontime"): "60m",
            format!("{OPTIONS}maxnodestartuptime"): "20m"}),
        "template",
    )
    .await;
    o.deployment(
        "daemonsets",
        Some(1),
        json!({MIN: "1", MAX: "2",
            format!("{OPTIONS}ignoredaemonsetsutilization"): "true",
            format!("{OPTIONS}zeroormaxnodescaling"): "true"}),
        "template",
    )
    .await;
    let alone = o.machine_set("alone", 1, json!({MIN: "0", MAX: "2"})).await;
    o.machine("alone-0", &alone, true, true, json!({"phase": "Running"}))
        .await;
    // A Node found only through Cluster API's annotations naming its Machine, which has no
    // provider ID yet (TestControllerFindMachineFromNodeAnnotation).
    let annotated = o
        .machine_set("annotated", 1, json!({MIN: "0", MAX: "2"}))
        .await;
    o.machine(
        "annotated-0",
        &annotated,
        false,
        false,
        json!({"phase": "Provisioning"}),
    )
    .await;
    ns.node(
        "annotated-0",
        &format!("test:////{n}-annotated-0"),
        BTreeMap::from([
            (
                "cluster.x-k8s.io/machine".to_string(),
                "annotated-0".to_string(),
            ),
            ("cluster.x-k8s.io/cluster-namespace".to_string(), n.clone()),
        ]),
    )
    .await;
    // Scale from zero on an infrastructure template that reports no `status.nodeInfo` (D26), and
    // a GPU in its capacity.
    o.infrastructure_template(
        "bare",
        json!({"capacity": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"}}),
    )
    .await;
    o.deployment("bare", Some(0), json!({MIN: "0", MAX: "3"}), "bare")
        .await;
    let pool_pids = [
        format!("test:////{n}-pool-0"),
        format!("test:////{n}-pool-1"),
    ];
    ns.machine_pool(
        "pool",
        2,
        json!({MIN: "1", MAX: "4"}),
        &[pool_pids[0].as_str(), pool_pids[1].as_str()],
    )
    .await;
    ns.node("pool-0", &pool_pids[0], BTreeMap::new()).await;
    o.deployment(
        "paused",
        Some(1),
        json!({MIN: "1", MAX: "3", PAUSED: ""}),
        "template",
    )
    .await;
    let plain = o.deployment("plain", Some(1), json!({}), "template").await;
    o.machine("plain-0", &plain, true, true, json!({"phase": "Running"}))
        .await;
    o.deployment(
        "missing-template",
        Some(0),
        json!({MIN: "0", MAX: "2"}),
        "missing",
    )
    .await;

    let operator = pki.operator(&ns, &discovery).await;
    let config = pki.cloud_config(&operator);
    let mut tally = Tally::default();
    check_step("corpus", &ns, &discovery, &config, &mut tally).await;

    // Step 2. Scaling: one more replica and a Machine for it, registered before nodeRef.
    o.patch(
        &machine_deployments(),
        "workers",
        json!({"spec": {"replicas": 4}}),
    )
    .await;
    o.patch(
        &machine_sets(),
        "workers-ms",
        json!({"spec": {"replicas": 4}}),
    )
    .await;
    o.machine(
        "workers-3",
        &workers,
        true,
        false,
        json!({"phase": "Provisioned"}),
    )
    .await;
    check_step("scaled up", &ns, &discovery, &config, &mut tally).await;

    // Step 3. A failed Machine (its infrastructure failed: no Node, a failure message) and a
    // deleted one (held by a finalizer).
    o.machine(
        "workers-4",
        &workers,
        false,
        false,
        json!({"phase": "Failed", "deprecated": {"v1beta1": {"failureReason": "CreateError", "failureMessage": "no capacity"}}}),
    )
    .await;
    ns.api(&machines())
        .delete("workers-1", &DeleteParams::default())
        .await
        .unwrap();
    check_step(
        "failed and deleted machines",
        &ns,
        &discovery,
        &config,
        &mut tally,
    )
    .await;

    // Step 4. Edge values of the capacity, labels, taints and option annotations (bounds valid).
    o.deployment(
        "edges",
        Some(0),
        json!({MIN: "0", MAX: "3",
            format!("{CAPACITY}memory"): "-4Gi",
            format!("{CAPACITY}labels"): " pool = a ,foo,zone=b",
            format!("{CAPACITY}taints"): "dedicated=batch:NoSchedule, spaced=x:NoExecute,k=v,a=b:noschedule",
            format!("{OPTIONS}scaledownutilizationthreshold"): "1.1",
            format!("{OPTIONS}scaledownunneededtime"): "-5m",
            format!("{OPTIONS}maxnodeprovisiontime"): "soon",
            format!("{OPTIONS}scaledownunreadytime"): ""}),
        "template",
    )
    .await;
    o.deployment(
        "bad-quantity",
        Some(1),
        json!({MIN: "0", MAX: "3", format!("{CAPACITY}cpu"): "16GB",
            format!("{CAPACITY}maxPods"): "many", format!("{CAPACITY}gpu-count"): ""}),
        "template",
    )
    .await;
    check_step(
        "capacity and option edge values",
        &ns,
        &discovery,
        &config,
        &mut tally,
    )
    .await;

    // Step 5. Annotation edits: bounds changed, options removed, a group paused and resumed.
    o.annotate(&machine_deployments(), "workers", json!({MAX: "4"}))
        .await;
    o.annotate(&machine_deployments(), "paused", json!({PAUSED: null}))
        .await;
    o.annotate(
        &machine_deployments(),
        "daemonsets",
        json!({
        format!("{OPTIONS}ignoredaemonsetsutilization"): null,
        format!("{OPTIONS}zeroormaxnodescaling"): null, PAUSED: ""}),
    )
    .await;
    check_step("annotation edits", &ns, &discovery, &config, &mut tally).await;

    // Step 6. spec.replicas unset, and a Machine matching a group's selector that no MachineSet
    // owns.
    let unset = o
        .deployment("unset", None, json!({MIN: "0", MAX: "3"}), "template")
        .await;
    o.machine("unset-0", &unset, true, true, json!({"phase": "Running"}))
        .await;
    o.machine_with(
        "orphan",
        &workers,
        true,
        true,
        json!({"phase": "Running"}),
        true,
    )
    .await;
    check_step(
        "replicas unset and an orphaned machine",
        &ns,
        &discovery,
        &config,
        &mut tally,
    )
    .await;

    // Step 7. Invalid bounds, each on a group of its own with a node: in-tree's NodeGroups then
    // lists nothing, and NodeGroupForNode shows its verdict resource by resource.
    for (name, bounds) in [
        ("space", json!({MIN: " 1", MAX: "3"})),
        ("huge", json!({MIN: "0", MAX: "3000000000"})),
        ("overflow", json!({MIN: "0", MAX: "99999999999999999999"})),
        ("negative", json!({MIN: "-1", MAX: "3"})),
        ("empty", json!({MIN: "", MAX: "3"})),
        ("inverted", json!({MIN: "3", MAX: "1"})),
        ("nomax", json!({MIN: "1"})),
    ] {
        let ms = o.deployment(name, Some(1), bounds, "template").await;
        o.machine(
            &format!("{name}-0"),
            &ms,
            true,
            true,
            json!({"phase": "Running"}),
        )
        .await;
    }
    check_step("invalid bounds", &ns, &discovery, &config, &mut tally).await;
    for name in [
        "space", "huge", "overflow", "negative", "empty", "inverted", "nomax",
    ] {
        ns.api(&machine_deployments())
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    check_step(
        "invalid bounds removed",
        &ns,
        &discovery,
        &config,
        &mut tally,
    )
    .await;
    // A paused group with an invalid bound, alone: in-tree parses the bounds before it looks
    // at the pause, so its NodeGroups lists nothing again (D1); its node maps to no group on
    // either side.
    let ms = o
        .deployment(
            "pausedbad",
            Some(1),
            json!({MIN: "x", MAX: "3", PAUSED: "true"}),
            "template",
        )
        .await;
    o.machine("pausedbad-0", &ms, true, true, json!({"phase": "Running"}))
        .await;
    check_step(
        "a paused group with an invalid bound",
        &ns,
        &discovery,
        &config,
        &mut tally,
    )
    .await;
    ns.api(&machine_deployments())
        .delete("pausedbad", &DeleteParams::default())
        .await
        .unwrap();
    operator.shutdown().await.unwrap();

    // Step 8. Auto-discovery with a label, on a MachineDeployment (not on its MachineSet) and on
    // a MachineSet alone.
    ns.label(
        &machine_deployments(),
        "workers",
        json!({"autoscale": "yes"}),
    )
    .await;
    ns.label(&machine_sets(), "alone", json!({"autoscale": "yes"}))
        .await;
    let labelled = format!("clusterapi:namespace={n},autoscale=yes");
    let operator = pki.operator(&ns, &labelled).await;
    let config = pki.cloud_config(&operator);
    check_step(
        "auto-discovery with a label",
        &ns,
        &labelled,
        &config,
        &mut tally,
    )
    .await;
    operator.shutdown().await.unwrap();

    // Every row this file shows must have shown its difference.
    let silent: Vec<&str> = ROWS
        .iter()
        .filter(|r| r.always && !tally.rows.contains_key(r.id))
        .map(|r| r.id)
        .collect();
    eprintln!(
        "{} steps, {} answers compared, {} differences, all listed: {}",
        tally.steps,
        tally.compared,
        tally.differences,
        tally
            .rows
            .iter()
            .map(|(id, ds)| format!("{id} x{}", ds.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (documented, shown_here) = migration_rows();
    for row in ROWS {
        assert!(
            shown_here.contains(row.id),
            "ROWS has {} but docs/migration.md has no row {} naming intree_diff",
            row.id,
            row.id
        );
    }
    let unrecognised: Vec<&String> = shown_here
        .iter()
        .filter(|id| !ROWS.iter().any(|r| r.id == id.as_str()))
        .collect();
    assert!(
        unrecognised.is_empty(),
        "docs/migration.md rows {unrecognised:?} name intree_diff, which has no recogniser for them"
    );
    assert!(documented.len() >= shown_here.len());
    assert!(
        silent.is_empty(),
        "rows of docs/migration.md naming intree_diff whose difference no longer occurs: {silent:?} \
         (the operator now answers as in-tree: remove the row, or the history lost its case)"
    );
}
