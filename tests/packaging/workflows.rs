//! The GitHub workflows: the tests gate every pull request and every release, and a release
//! signs what it publishes.

use serde_json::Value;

fn workflow(name: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".github/workflows")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The shell of every `run` step of `job`.
fn runs(job: &Value) -> Vec<String> {
    job["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["run"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn every_pull_request_and_every_release_runs_the_ci_entry_point_first() {
    let ci = workflow("ci.yaml");
    // YAML reads the key `on` as the string "on" here (serde_yaml follows YAML 1.2).
    let on = &ci["on"];
    for trigger in ["pull_request", "push", "workflow_call"] {
        assert!(on.get(trigger).is_some(), "ci.yaml runs on {trigger}: {on}");
    }
    assert!(
        runs(&ci["jobs"]["test"])
            .iter()
            .any(|r| r.contains("bash .ci/run")),
        "ci.yaml runs .ci/run"
    );

    let release = workflow("release.yaml");
    let jobs = &release["jobs"];
    assert_eq!(jobs["test"]["uses"], "./.github/workflows/ci.yaml");
    assert_eq!(
        jobs["image"]["needs"], "test",
        "no image before the tests pass"
    );
    assert_eq!(jobs["chart"]["needs"], "image");
}

#[test]
fn a_release_signs_its_image_and_its_chart_keyless_by_digest() {
    let release = workflow("release.yaml");
    for job in ["image", "chart"] {
        let job = &release["jobs"][job];
        assert_eq!(job["permissions"]["id-token"], "write", "{job}");
        assert!(
            job["steps"].as_array().unwrap().iter().any(|s| s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with("sigstore/cosign-installer@"))),
            "{job}"
        );
    }
    let image = runs(&release["jobs"]["image"]);
    assert!(
        image
            .iter()
            .any(|r| r.contains("cosign sign --yes \"$IMAGE\"")),
        "{image:?}"
    );
    let signed_image = release["jobs"]["image"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["run"].as_str().is_some_and(|r| r.contains("cosign sign")))
        .unwrap();
    assert!(
        signed_image["env"]["IMAGE"]
            .as_str()
            .is_some_and(|i| i.ends_with("@${{ steps.build.outputs.digest }}")),
        "the image is signed by digest, not by tag: {signed_image}"
    );
    let chart = runs(&release["jobs"]["chart"]);
    assert!(
        chart
            .iter()
            .any(|r| r.contains("cosign sign --yes \"$CHART\"")),
        "{chart:?}"
    );
    assert!(
        chart.iter().any(|r| r.contains("sed -n 's/^Digest: *//p'")),
        "the chart is signed by the digest helm push printed: {chart:?}"
    );
}
