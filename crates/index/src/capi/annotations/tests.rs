use super::*;

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn bounds(min: Option<&str>, max: Option<&str>) -> Result<Bounds, AnnotationError> {
    let keys = CapiKeys::default();
    let mut a = BTreeMap::new();
    if let Some(m) = min {
        a.insert(keys.min_size.clone(), m.to_string());
    }
    if let Some(m) = max {
        a.insert(keys.max_size.clone(), m.to_string());
    }
    parse_bounds(&a, &keys)
}

/// The DRA and CSI driver annotations, which in-tree turns into ResourceSlices and a
/// CSINode of the template, cannot travel over externalgrpc (a template is a Node):
/// each is reported as ignored, never dropped silently.
#[test]
fn dra_and_csi_driver_annotations_are_reported_as_not_carried() {
    let a = ann(&[
        (
            "capacity.cluster-autoscaler.kubernetes.io/dra-driver",
            "gpu.nvidia.com=2",
        ),
        (
            "capacity.cluster-autoscaler.kubernetes.io/csi-driver",
            "ebs.csi.aws.com=25",
        ),
        ("capacity.cluster-autoscaler.kubernetes.io/cpu", "4"),
    ]);
    let (hints, warnings) = parse_capacity(&a);
    assert_eq!(hints.cpu.as_deref(), Some("4"));
    let keys: Vec<&str> = warnings.iter().map(|w| w.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "capacity.cluster-autoscaler.kubernetes.io/dra-driver",
            "capacity.cluster-autoscaler.kubernetes.io/csi-driver"
        ]
    );
    assert!(
        warnings
            .iter()
            .all(|w| w.fallback == Fallback::Ignored && w.reason.contains("externalgrpc")),
        "{warnings:?}"
    );
    assert!(parse_capacity(&ann(&[])).1.is_empty());
}

#[test]
fn bounds_missing_values_are_none() {
    assert_eq!(
        bounds(None, Some("3")).unwrap(),
        Bounds {
            min: None,
            max: Some(3)
        }
    );
    assert_eq!(
        bounds(Some("1"), None).unwrap(),
        Bounds {
            min: Some(1),
            max: None
        }
    );
    assert_eq!(
        bounds(Some("2"), Some("2")).unwrap(),
        Bounds {
            min: Some(2),
            max: Some(2)
        }
    );
}

#[test]
fn bounds_reject_negative_non_integer_and_inverted() {
    let e = bounds(Some("-1"), Some("3")).unwrap_err();
    assert!(e.to_string().contains("must not be negative"), "{e}");
    let e = bounds(Some("1"), Some("three")).unwrap_err();
    assert!(
        e.to_string()
            .contains("cluster-api-autoscaler-node-group-max-size"),
        "{e}"
    );
    assert!(e.to_string().contains("must be an integer"), "{e}");
    let e = bounds(Some("5"), Some("3")).unwrap_err();
    assert!(e.to_string().contains("below min size 5"), "{e}");
}

#[test]
fn options_are_parsed_lower_cased_and_case_sensitive_in_name() {
    let keys = CapiKeys::default();
    let a = ann(&[
        (
            "cluster.x-k8s.io/autoscaling-options-scaledownutilizationthreshold",
            "0.7",
        ),
        (
            "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime",
            "5M",
        ),
        (
            "cluster.x-k8s.io/autoscaling-options-maxnodeprovisiontime",
            "",
        ),
        (
            "cluster.x-k8s.io/autoscaling-options-ScaleDownUnreadyTime",
            "1m",
        ),
        (
            "cluster.x-k8s.io/autoscaling-options-ignoredaemonsetsutilization",
            "TRUE",
        ),
    ]);
    let o = parse_options(&a, &keys).0;
    assert_eq!(o.scale_down_utilization_threshold, Some(0.7));
    assert_eq!(o.scale_down_unneeded_time, Some(Duration::from_secs(300)));
    assert_eq!(o.max_node_provision_time, None, "empty values are ignored");
    assert_eq!(o.scale_down_unready_time, None, "names are case-sensitive");
    assert_eq!(o.ignore_daemonsets_utilization, Some(true));
    assert!(parse_options(&BTreeMap::new(), &keys).0.is_empty());
}

#[test]
fn option_overrides_merge_field_by_field() {
    let a = OptionOverrides {
        scale_down_utilization_threshold: Some(0.3),
        ..Default::default()
    };
    let b = OptionOverrides {
        scale_down_utilization_threshold: Some(0.9),
        max_node_provision_time: Some(Duration::from_secs(60)),
        ..Default::default()
    };
    let merged = a.or(&b);
    assert_eq!(merged.scale_down_utilization_threshold, Some(0.3));
    assert_eq!(
        merged.max_node_provision_time,
        Some(Duration::from_secs(60))
    );
}

#[test]
fn capacity_annotations_are_parsed() {
    let a = ann(&[
        ("capacity.cluster-autoscaler.kubernetes.io/cpu", "4"),
        ("capacity.cluster-autoscaler.kubernetes.io/memory", "16Gi"),
        (
            "capacity.cluster-autoscaler.kubernetes.io/ephemeral-disk",
            "100Gi",
        ),
        (
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
            "nvidia.com/gpu",
        ),
        ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "2"),
        ("capacity.cluster-autoscaler.kubernetes.io/maxPods", "50"),
        (
            "capacity.cluster-autoscaler.kubernetes.io/labels",
            "a=b, node.kubernetes.io/pool=x",
        ),
        (
            "capacity.cluster-autoscaler.kubernetes.io/taints",
            "dedicated=gpu:NoSchedule,spot:PreferNoSchedule,plain",
        ),
    ]);
    let c = parse_capacity(&a).0;
    assert_eq!(c.cpu.as_deref(), Some("4"));
    assert_eq!(c.memory.as_deref(), Some("16Gi"));
    assert_eq!(c.ephemeral_storage.as_deref(), Some("100Gi"));
    assert_eq!(c.gpu, Some(("nvidia.com/gpu".to_string(), 2)));
    assert_eq!(c.max_pods, Some(50));
    assert_eq!(
        c.labels.get("node.kubernetes.io/pool").map(String::as_str),
        Some("x")
    );
    assert_eq!(c.taints.len(), 3);
    assert_eq!(
        c.taints[0],
        Taint {
            key: "dedicated".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into()
        }
    );
    assert_eq!(
        c.taints[1],
        Taint {
            key: "spot".into(),
            value: "".into(),
            effect: "PreferNoSchedule".into()
        }
    );
    assert_eq!(c.taints[2].effect, "");
}

#[test]
fn gpu_needs_both_type_and_non_zero_count() {
    let only_type = ann(&[(
        "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
        "nvidia.com/gpu",
    )]);
    assert_eq!(parse_capacity(&only_type).0.gpu, None);
    let zero = ann(&[
        (
            "capacity.cluster-autoscaler.kubernetes.io/gpu-type",
            "nvidia.com/gpu",
        ),
        ("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "0"),
    ]);
    assert_eq!(parse_capacity(&zero).0.gpu, None);
    let only_count = ann(&[("capacity.cluster-autoscaler.kubernetes.io/gpu-count", "1")]);
    assert_eq!(parse_capacity(&only_count).0.gpu, None);
}

fn opts(pairs: &[(&str, &str)]) -> (OptionOverrides, Vec<AnnotationWarning>) {
    let a = pairs
        .iter()
        .map(|(k, v)| {
            (
                format!("cluster.x-k8s.io/autoscaling-options-{k}"),
                v.to_string(),
            )
        })
        .collect();
    parse_options(&a, &CapiKeys::default())
}

fn capacity(pairs: &[(&str, &str)]) -> (CapacityHints, Vec<AnnotationWarning>) {
    let a = pairs
        .iter()
        .map(|(k, v)| (format!("{CAPACITY_PREFIX}{k}"), v.to_string()))
        .collect();
    parse_capacity(&a)
}

#[test]
fn unparsable_options_are_ignored_with_a_warning_naming_the_annotation() {
    let (o, w) = opts(&[
        ("scaledownunneededtime", "10"),
        ("scaledownunreadytime", "2m"),
    ]);
    assert_eq!(o.scale_down_unneeded_time, None, "CA's default applies");
    assert_eq!(o.scale_down_unready_time, Some(Duration::from_secs(120)));
    assert_eq!(w.len(), 1);
    assert_eq!(
        w[0].key,
        "cluster.x-k8s.io/autoscaling-options-scaledownunneededtime"
    );
    assert_eq!(w[0].fallback, Fallback::Ignored);
    assert!(
        w[0].to_string().contains("ignored, as if unset"),
        "{}",
        w[0]
    );
}

#[test]
fn thresholds_outside_zero_to_one_are_ignored_with_a_warning() {
    for bad in ["1.1", "-0.1", "nan", "inf", "half"] {
        let (o, w) = opts(&[("scaledownutilizationthreshold", bad)]);
        assert_eq!(o.scale_down_utilization_threshold, None, "{bad}");
        assert_eq!(w.len(), 1, "{bad}");
    }
    let (o, w) = opts(&[("scaledowngpuutilizationthreshold", "1")]);
    assert_eq!(o.scale_down_gpu_utilization_threshold, Some(1.0));
    assert!(w.is_empty());
}

#[test]
fn negative_durations_and_bad_flags_are_ignored_with_a_warning() {
    let (o, w) = opts(&[
        ("maxnodeprovisiontime", "-5m"),
        ("ignoredaemonsetsutilization", "yes"),
        ("zeroormaxnodescaling", "T"),
    ]);
    assert_eq!(o.max_node_provision_time, None);
    assert_eq!(o.ignore_daemonsets_utilization, None);
    assert_eq!(
        o.zero_or_max_node_scaling,
        Some(true),
        "Go's ParseBool words"
    );
    assert_eq!(w.len(), 2);
}

#[test]
fn a_bad_quantity_is_ignored_and_the_other_capacity_annotations_apply() {
    let (c, w) = capacity(&[("cpu", "4"), ("memory", "16GB"), ("ephemeral-disk", "-1Gi")]);
    assert_eq!(c.cpu.as_deref(), Some("4"));
    assert_eq!(c.memory, None);
    assert_eq!(c.ephemeral_storage, None);
    assert_eq!(w.len(), 2);
    assert_eq!(w[0].key, "capacity.cluster-autoscaler.kubernetes.io/memory");
    assert!(w[1].reason.contains("negative"), "{}", w[1]);
}

#[test]
fn empty_and_zero_capacity_values_are_absent_without_warning_as_upstream() {
    let (c, w) = capacity(&[
        ("cpu", ""),
        ("memory", "0"),
        ("maxPods", "0"),
        ("gpu-type", "nvidia.com/gpu"),
        ("gpu-count", "0"),
    ]);
    assert_eq!(c, CapacityHints::default());
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn bad_counts_are_ignored_with_a_warning() {
    let (c, w) = capacity(&[
        ("gpu-type", "nvidia.com/gpu"),
        ("gpu-count", "1.5"),
        ("maxPods", "-1"),
    ]);
    assert_eq!((c.gpu, c.max_pods), (None, None));
    assert_eq!(w.len(), 2);
}

#[test]
fn a_label_item_without_equals_is_skipped_and_the_rest_kept() {
    let (c, w) = capacity(&[("labels", "pool=a,foo")]);
    assert_eq!(
        c.labels,
        BTreeMap::from([("pool".to_string(), "a".to_string())])
    );
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].fallback, Fallback::ItemSkipped("foo".into()));
}

#[test]
fn an_invalid_label_is_kept_as_written_with_a_warning_as_upstream() {
    let (c, w) = capacity(&[("labels", "bad key=x,a=b=c")]);
    assert_eq!(c.labels.get("bad key").map(String::as_str), Some("x"));
    assert_eq!(
        c.labels.get("a").map(String::as_str),
        Some("b=c"),
        "split on the first ="
    );
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(matches!(w[0].fallback, Fallback::KeptAsWritten(_)));
}

#[test]
fn taints_follow_upstream_parse_taint() {
    let (c, w) = capacity(&[(
        "taints",
        "a=b:noschedule, k=v ,x:y:NoSchedule,a=b=c:NoExecute,bad key:NoSchedule,ok:NoExecute,",
    )]);
    assert_eq!(
        c.taints,
        vec![
            Taint {
                key: "a".into(),
                value: "b".into(),
                effect: "noschedule".into()
            },
            Taint {
                key: "ok".into(),
                value: "".into(),
                effect: "NoExecute".into()
            },
        ],
        "unknown effects are kept as written; k=v without effect, two colons, two equals and bad keys are skipped"
    );
    let fallbacks: Vec<&Fallback> = w.iter().map(|w| &w.fallback).collect();
    assert_eq!(
        fallbacks,
        vec![
            &Fallback::KeptAsWritten("a=b:noschedule".into()),
            &Fallback::ItemSkipped("k=v".into()),
            &Fallback::ItemSkipped("x:y:NoSchedule".into()),
            &Fallback::ItemSkipped("a=b=c:NoExecute".into()),
            &Fallback::ItemSkipped("bad key:NoSchedule".into()),
        ]
    );
}

mod properties {
    use proptest::prelude::*;

    use super::super::*;

    const OPTION_NAMES: [&str; 9] = [
        "scaledownutilizationthreshold",
        "scaledowngpuutilizationthreshold",
        "scaledownunneededtime",
        "scaledownunreadytime",
        "maxnodeprovisiontime",
        "maxnodestartuptime",
        "ignoredaemonsetsutilization",
        "zeroormaxnodescaling",
        "unknownoption",
    ];
    const CAPACITY_NAMES: [&str; 8] = [
        "cpu",
        "memory",
        "ephemeral-disk",
        "gpu-type",
        "gpu-count",
        "maxPods",
        "labels",
        "taints",
    ];

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![any::<String>(), "[-+0-9.a-zA-Z=:,/ µ]{0,24}"]
    }

    fn dns_prefix() -> impl Strategy<Value = String> {
        "[a-z0-9]{1,8}(\\.[a-z0-9]{1,8}){0,2}"
    }

    fn label_name() -> impl Strategy<Value = String> {
        "[A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?"
    }

    fn label_key() -> impl Strategy<Value = String> {
        (proptest::option::of(dns_prefix()), label_name()).prop_map(|(prefix, name)| match prefix {
            Some(p) => format!("{p}/{name}"),
            None => name,
        })
    }

    fn label_value() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), label_name()]
    }

    fn effect() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            Just("NoSchedule"),
            Just("PreferNoSchedule"),
            Just("NoExecute")
        ]
    }

    proptest! {
        #[test]
        fn bounds_never_panic_and_accept_exactly_ordered_non_negative_integers(
            min in value(), max in value(),
        ) {
            let keys = CapiKeys::default();
            let a = BTreeMap::from([
                (keys.min_size.clone(), min.clone()),
                (keys.max_size.clone(), max.clone()),
            ]);
            let ok = matches!(
                (min.trim().parse::<i32>(), max.trim().parse::<i32>()),
                (Ok(lo), Ok(hi)) if lo >= 0 && hi >= lo
            );
            prop_assert_eq!(parse_bounds(&a, &keys).is_ok(), ok);
        }

        #[test]
        fn valid_bounds_are_read_back(min in 0..=i32::MAX, extra in 0..=i32::MAX) {
            let max = min.saturating_add(extra);
            let keys = CapiKeys::default();
            let a = BTreeMap::from([
                (keys.min_size.clone(), min.to_string()),
                (keys.max_size.clone(), max.to_string()),
            ]);
            prop_assert_eq!(parse_bounds(&a, &keys), Ok(Bounds { min: Some(min), max: Some(max) }));
        }

        #[test]
        fn options_never_panic_and_warn_once_per_unusable_known_option(
            values in proptest::collection::vec((0..OPTION_NAMES.len(), value()), 0..8),
        ) {
            let keys = CapiKeys::default();
            let a: BTreeMap<String, String> = values
                .iter()
                .map(|(i, v)| (format!("{}{}", keys.options_prefix, OPTION_NAMES[*i]), v.clone()))
                .collect();
            let (options, warnings) = parse_options(&a, &keys);
            prop_assert!(warnings.len() <= a.len());
            for w in &warnings {
                prop_assert!(a.contains_key(&w.key));
                prop_assert_eq!(&w.fallback, &Fallback::Ignored);
                prop_assert!(!w.key.ends_with("unknownoption"));
            }
            for t in [options.scale_down_utilization_threshold, options.scale_down_gpu_utilization_threshold].into_iter().flatten() {
                prop_assert!((0.0..=1.0).contains(&t));
            }
        }

        #[test]
        fn formatted_options_are_read_back_without_warnings(
            threshold in 0.0f64..=1.0,
            nanos in 0..=i64::MAX as u64,
            flag in any::<bool>(),
        ) {
            let keys = CapiKeys::default();
            let d = Duration::from_nanos(nanos);
            let key = |name: &str| format!("{}{name}", keys.options_prefix);
            let a = BTreeMap::from([
                (key("scaledownutilizationthreshold"), threshold.to_string()),
                (key("scaledownunneededtime"), crate::duration::format(d)),
                (key("zeroormaxnodescaling"), flag.to_string().to_uppercase()),
            ]);
            let (options, warnings) = parse_options(&a, &keys);
            prop_assert!(warnings.is_empty(), "{warnings:?}");
            prop_assert_eq!(options.scale_down_utilization_threshold, Some(threshold));
            prop_assert_eq!(options.scale_down_unneeded_time, Some(d));
            prop_assert_eq!(options.zero_or_max_node_scaling, Some(flag));
        }

        #[test]
        fn capacity_never_panics_and_keeps_only_usable_values(
            values in proptest::collection::vec((0..CAPACITY_NAMES.len(), value()), 0..8),
        ) {
            let a: BTreeMap<String, String> = values
                .iter()
                .map(|(i, v)| (format!("{CAPACITY_PREFIX}{}", CAPACITY_NAMES[*i]), v.clone()))
                .collect();
            let (hints, warnings) = parse_capacity(&a);
            for w in &warnings {
                prop_assert!(a.contains_key(&w.key), "{}", w.key);
            }
            for q in [&hints.cpu, &hints.memory, &hints.ephemeral_storage].into_iter().flatten() {
                prop_assert!(crate::quantity::parse(q).is_ok_and(|n| n > 0.0), "{q}");
            }
            if let Some((gpu_type, count)) = &hints.gpu {
                prop_assert!(!gpu_type.is_empty() && *count > 0);
            }
            prop_assert!(hints.max_pods.is_none_or(|n| n > 0));
        }

        #[test]
        fn label_lists_never_panic(list in value()) {
            let (labels, warnings) = parse_label_list("k", &list);
            prop_assert!(labels.len() + warnings.len() <= list.split(',').count() * 2);
        }

        #[test]
        fn valid_label_lists_round_trip_without_warnings(
            labels in proptest::collection::btree_map(label_key(), label_value(), 0..6),
        ) {
            let text = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
            let (parsed, warnings) = parse_label_list("k", &text);
            prop_assert!(warnings.is_empty(), "{warnings:?}");
            prop_assert_eq!(parsed, labels);
        }

        #[test]
        fn taint_lists_never_panic_and_keep_only_valid_keys(list in value()) {
            let (taints, warnings) = parse_taint_list("k", &list);
            for t in &taints {
                prop_assert!(crate::capi::autodiscovery::validate_label(&t.key, &t.value).is_ok());
            }
            prop_assert!(taints.len() + warnings.len() <= list.split(',').count() * 2);
        }

        #[test]
        fn valid_taint_lists_round_trip_without_warnings(
            taints in proptest::collection::vec((label_key(), label_value(), effect()), 0..6),
        ) {
            let text = taints
                .iter()
                .map(|(k, v, e)| if v.is_empty() { format!("{k}:{e}") } else { format!("{k}={v}:{e}") })
                .collect::<Vec<_>>()
                .join(",");
            let (parsed, warnings) = parse_taint_list("k", &text);
            prop_assert!(warnings.is_empty(), "{warnings:?}");
            let expected: Vec<Taint> = taints
                .iter()
                .map(|(k, v, e)| Taint { key: k.clone(), value: v.clone(), effect: (*e).into() })
                .collect();
            prop_assert_eq!(parsed, expected);
        }
    }
}

/// A tenant's label or taint list of many bad items costs a bounded report: a few item
/// warnings (each quoting the value cut short) and one that counts the rest, not a copy of the
/// whole value per item (a 256 KiB `a,a,a,…` made 128 Ki copies of 256 KiB).
#[test]
fn a_list_of_many_bad_items_gives_a_bounded_report() {
    let value = "a,".repeat(128 * 1024);
    let key = "capacity.cluster-autoscaler.kubernetes.io/labels";
    let (labels, warnings) = parse_label_list(key, &value);
    assert!(labels.is_empty());
    let (taints, taint_warnings) = parse_taint_list(key, &"k=v=w:NoSchedule,".repeat(16 * 1024));
    assert!(taints.is_empty());
    for warnings in [&warnings, &taint_warnings] {
        assert!(
            warnings.len() <= MAX_ITEM_WARNINGS + 1,
            "{} warnings",
            warnings.len()
        );
        let text: usize = warnings.iter().map(|w| w.to_string().len()).sum();
        let held: usize = warnings.iter().map(|w| w.value.len()).sum();
        assert!(
            text < 8 * 1024 && held < 2 * 1024,
            "{text} bytes shown, {held} held"
        );
        let last = warnings.last().expect("warnings").to_string();
        assert!(last.contains("more items"), "{last}");
    }
    // A few bad items are each reported, with the value as shown before.
    let (_, few) = parse_label_list(key, "a=b,c,d");
    assert_eq!(few.len(), 2);
    assert_eq!(
        few[0].to_string(),
        "annotation capacity.cluster-autoscaler.kubernetes.io/labels=\"a=b,c,d\": label \"c\" is not key=value; item \"c\" skipped"
    );
}

/// A bound's error quotes a tenant's value cut short: it reaches the log and the policy's
/// status whole otherwise.
#[test]
fn a_bad_bound_is_quoted_cut_short() {
    let huge = "9".repeat(100_000);
    let error = bounds(Some(&huge), Some("3")).expect_err("not an i32");
    let text = error.to_string();
    assert!(text.len() < 400, "{} bytes", text.len());
    assert!(text.contains("(100000 bytes)"), "{text}");
}
