//! The monitoring kit in deploy/monitoring: the alert rules pass promtool's
//! check and their unit tests, and every metric the rules and the Grafana
//! dashboard query is one a live replica exports.

use drover_client::v1;
use drover_tests::fixture::Fixture;
use drover_tests::{create_running, repair_now, scrape, wait_until};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .join("deploy/monitoring")
}

/// Runs promtool; a missing promtool fails the test (CI must run it).
fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(monitoring_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool: {e}; it comes with Debian's prometheus package (scripts/install-deps.sh installs it)")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_pass_promtools_check_and_their_unit_tests() {
    let checked = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_alert_rule_has_a_unit_test_case() {
    let dir = monitoring_dir();
    let rules = std::fs::read_to_string(dir.join("alerts.yaml")).unwrap();
    let tests = std::fs::read_to_string(dir.join("alerts_test.yaml")).unwrap();
    let names = |text: &str, key: &str| -> BTreeSet<String> {
        text.lines()
            .filter_map(|line| line.trim().strip_prefix(key))
            .map(|name| name.trim().to_string())
            .collect()
    };
    let alerts = names(&rules, "- alert:");
    assert!(alerts.len() >= 10, "{alerts:?}");
    let tested = names(&tests, "alertname:");
    let untested: Vec<_> = alerts.difference(&tested).collect();
    assert!(untested.is_empty(), "rules without a test: {untested:?}");
}

/// Every `drover_...` name in `text` (the dashboard's or the rules'
/// queries).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("drover_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

/// The series names an exposition offers: each sample's, and for each
/// declared family the names its samples take (a counter's `_total`, a
/// histogram's `_bucket`, `_sum`, `_count`), since a family with no
/// sample yet (no etcd error so far) is still exported.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut parts = declared.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_rules_query_is_exported_by_a_replica() {
    let dir = monitoring_dir();
    let dashboard = std::fs::read_to_string(dir.join("grafana-dashboard.json")).unwrap();
    let rules = std::fs::read_to_string(dir.join("alerts.yaml")).unwrap();
    let queried = metric_names(&format!("{dashboard}\n{rules}"));
    assert!(queried.len() >= 10, "{queried:?}");

    let mut f = Fixture::builder().scan_interval(1).start().await;
    let replica = &f.replicas[0];
    // Work, so that the labelled series (provider calls, a finished
    // operation, transitions, a task's last success) exist.
    create_running(&mut f.client, "monitored", 1).await;
    f.client
        .tasks()
        .put_task(v1::PutTaskRequest {
            cluster: "monitored".into(),
            task: Some(repair_now("nightly")),
        })
        .await
        .expect("put a repair task");
    let admin = replica.admin_endpoint();
    wait_until(Duration::from_secs(30), "a repair run to succeed", || {
        let admin = admin.clone();
        async move {
            let samples = scrape::metrics(&admin).await;
            scrape::sum(&samples, "drover_task_last_success_timestamp_seconds", "") > 0.0
        }
    })
    .await;

    // A rollout held at its approval gate: its owner reports it.
    let gated = v1::RolloutSpec {
        clusters: vec!["monitored".into()],
        version: "1.30.0".into(),
        stages: vec![v1::RolloutStage {
            name: "all".into(),
            approval_required: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: "gated".into(),
        spec: Some(gated),
    };
    f.client
        .rollouts()
        .create_rollout(request)
        .await
        .expect("a rollout");
    wait_until(
        Duration::from_secs(30),
        "the rollout's owner to report it",
        || {
            let admin = admin.clone();
            async move {
                let samples = scrape::metrics(&admin).await;
                scrape::sum(
                    &samples,
                    "drover_rollout_state",
                    "state=\"waiting_approval\"",
                ) > 0.0
            }
        },
    )
    .await;

    let body = scrape::get(&replica.admin_endpoint(), "/metrics").await;
    let exposition = String::from_utf8_lossy(&body);
    let exported = exported_names(&exposition);
    let missing: Vec<_> = queried.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "queried but not exported: {missing:?}\n{exposition}"
    );
    let samples = scrape::metrics(&replica.admin_endpoint()).await;
    let provider_calls = scrape::sum(
        &samples,
        "drover_provider_request_duration_seconds_count",
        "",
    );
    assert!(provider_calls > 0.0, "no provider call recorded");
}

#[test]
fn the_dashboard_has_job_and_instance_variables_and_a_provider_latency_panel() {
    let text = std::fs::read_to_string(monitoring_dir().join("grafana-dashboard.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for wanted in ["datasource", "job", "instance"] {
        assert!(variables.contains(&wanted), "variables {variables:?}");
    }
    let panels = dashboard["panels"].as_array().expect("panels");
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("drover_provider_request_duration_seconds_bucket")),
        "no provider latency panel"
    );
    // Every query of a drover metric is filtered by the variables.
    for expr in exprs.iter().filter(|e| e.contains("drover_")) {
        assert!(
            expr.contains("job=~\"$job\"") && expr.contains("instance=~\"$instance\""),
            "not filtered by $job and $instance: {expr}"
        );
    }
}
