//! The console acts, in a real browser: headless Chromium against a real
//! replica with a viewer and an operator token, a real etcd and the
//! simulator. The viewer sees a cluster and no button, and the API
//! refuses the viewer's pause; a form post (what another site could send)
//! changes nothing. The operator pauses a cluster and suspends its tasks
//! (each confirmed in a dialog that names what it does; the spec in etcd
//! shows it), recovers the paused cluster's fault (which nothing
//! remediates while it is paused), cancels a running operation from its
//! cluster's page, and
//! cancels the running operations of the clusters a label picks, asked
//! for their count first. Each action, and the viewer's refusal, is in
//! the audit log once, with the token's name and role and never the token.
//! Screenshots go to `target/console-screenshots/`.

use drover_client::v1::{self, OperationState as O};
use drover_client::{Client, ConnectOptions};
use drover_server::cluster::SpecRecord;
use drover_server::keys::KeyLayout;
use drover_server::store::Store;
use drover_tests::browser::{self, screenshots, until, Browser};
use drover_tests::console::{http, sign_in, token_file};
use drover_tests::fixture::Backends;
use drover_tests::{create_running, wait_for_state, wait_running, TempDir};
use std::time::Duration;

const VIEWER: &str = "viewer-token-1";
const OPERATOR: &str = "operator-token-2";
const WAIT: Duration = Duration::from_secs(60);

/// The spec of `cluster` as etcd holds it.
async fn stored_spec(backends: &Backends, cluster: &str) -> SpecRecord {
    let store = backends.etcd.store().await;
    let key = KeyLayout::new("/drover/v1/").cluster_spec(cluster);
    let kv = store.get(&key).await.unwrap().kvs.remove(0);
    serde_json::from_slice(&kv.value).expect("a spec record")
}

async fn upgrade(client: &mut Client, cluster: &str) -> v1::Operation {
    let request = v1::UpgradeClusterRequest {
        name: cluster.into(),
        version: "1.30.0".into(),
        ..Default::default()
    };
    let op = client.clusters().upgrade_cluster(request).await;
    op.expect("upgrade accepted").into_inner()
}

/// Clicks `button`, checks the dialog names `named`, confirms, and waits
/// for the page to report `done`.
async fn confirm(browser: &mut Browser, button: &str, named: &str, done: &str) {
    let mut seen = Vec::new();
    let present = format!("!!document.getElementById('{button}')");
    until(browser, &present, WAIT, &mut seen, |v| v == true).await;
    browser.eval(&format!(
        "document.getElementById('{button}').click(); true"
    ));
    let dialog = "document.getElementById('confirm').open";
    until(browser, dialog, WAIT, &mut seen, |v| v == true).await;
    let text = browser.eval("document.getElementById('confirm-text').textContent");
    assert!(
        text.as_str().is_some_and(|t| t.starts_with(named)),
        "{text}"
    );
    browser.eval("document.getElementById('confirm-ok').click(); true");
    let result = "document.getElementById('action-result').textContent";
    until(browser, result, WAIT, &mut seen, |v| {
        v.as_str().is_some_and(|t| t.starts_with(done))
    })
    .await;
}

/// What the viewer and a cross-site form may not do, through the API.
async fn refusals(admin: &str, backends: &Backends) {
    let (status, body) = http(admin, "GET", "/ui/api/clusters/web", VIEWER, None);
    assert_eq!(status, 200, "{body}");
    let shown: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(shown["actions"], serde_json::json!([]), "{body}");
    let json = Some(("application/json", "{}"));
    let (status, body) = http(admin, "POST", "/ui/api/clusters/web/pause", VIEWER, json);
    assert_eq!(status, 403, "{body}");
    let form = Some(("application/x-www-form-urlencoded", "x=1"));
    let (status, body) = http(admin, "POST", "/ui/api/clusters/web/pause", OPERATOR, form);
    assert_eq!(status, 415, "{body}");
    let (status, body) = http(admin, "POST", "/ui/api/bulk/cancel", OPERATOR, json);
    assert_eq!(status, 400, "a bulk action needs a selector: {body}");
    assert!(
        !stored_spec(backends, "web").await.spec.paused,
        "nothing changed"
    );
}

#[tokio::test]
async fn an_operator_pauses_suspends_and_cancels_from_the_console() {
    if !browser::available() {
        panic!("chromium is missing: run scripts/install-deps.sh");
    }
    let backends = Backends::start().await;
    let dir = TempDir::new("console-actions");
    let tokens = [("dash", "viewer", VIEWER), ("ci", "operator", OPERATOR)];
    let tokens = token_file(dir.path(), &tokens);
    let tokens = tokens.to_str().expect("a UTF-8 path");
    let audit_log = dir.path().join("audit.log");
    let audit = audit_log.to_str().expect("a UTF-8 path");
    // A scan a second: a cancelled upgrade's Alert is recovered quickly.
    let args = [
        "--auth-tokens",
        tokens,
        "--scan-interval",
        "1",
        "--audit-log",
        audit,
    ];
    let replica = backends.serve("r1", &args).await;
    let options = ConnectOptions {
        token: Some(OPERATOR.into()),
        ..Default::default()
    };
    let mut client = Client::connect_with(&replica.endpoint(), &options)
        .await
        .expect("connect");
    let web = create_running(&mut client, "web", 1).await;
    for name in ["db", "cache"] {
        create_running(&mut client, name, 1).await;
    }
    let label = |name: &str, team: &str| v1::UpdateClusterRequest {
        name: name.into(),
        labels: [("team".to_string(), team.to_string())].into(),
        update_labels: true,
        ..Default::default()
    };
    for (name, team) in [("web", "a"), ("db", "a"), ("cache", "b")] {
        client
            .clusters()
            .update_cluster(label(name, team))
            .await
            .unwrap();
    }
    let admin = replica.admin_endpoint();
    refusals(&admin, &backends).await;

    let mut browser = Browser::start();
    let mut seen = Vec::new();
    browser.navigate(&format!("{admin}/ui/#/clusters/web"));
    sign_in(&mut browser, VIEWER, WAIT).await;
    let state = "(document.getElementById('cluster-state') || {}).textContent || ''";
    until(&mut browser, state, WAIT, &mut seen, |v| v == "RUNNING").await;
    let buttons = "document.querySelectorAll('#cluster-actions button').length";
    assert_eq!(browser.eval(buttons), 0, "a viewer is shown no action");

    // The operator pauses the cluster and suspends its tasks.
    browser.eval("document.getElementById('logout').click(); true");
    sign_in(&mut browser, OPERATOR, WAIT).await;
    confirm(
        &mut browser,
        "action-pause",
        "Pause cluster web:",
        "Pause: done.",
    )
    .await;
    assert!(stored_spec(&backends, "web").await.spec.paused);
    let named = "Suspend the task runs of cluster web:";
    confirm(
        &mut browser,
        "action-suspend-tasks",
        named,
        "Suspend tasks: done.",
    )
    .await;
    let spec = stored_spec(&backends, "web").await.spec;
    assert!(spec.tasks_suspended.is_some_and(|s| s.until.is_none()));
    let paused = "(document.getElementById('cluster-paused') || {}).textContent || ''";
    until(&mut browser, paused, WAIT, &mut seen, |v| v == "paused").await;
    std::fs::write(
        screenshots().join("cluster-actions.png"),
        browser.screenshot(),
    )
    .expect("save");

    // Paused, its fault is observed but not remediated: the operator
    // starts the Recover from its page.
    backends.sim.set_health(&web.uid, false).await;
    wait_for_state(&client, "web", v1::ClusterState::Alert, WAIT).await;
    // Past a short health timeout its node shows unhealthy, and the page
    // says why remediation holds back.
    let health = v1::UpdateClusterRequest {
        name: "web".into(),
        health: Some(v1::HealthPolicy {
            unhealthy_timeout_seconds: Some(1),
            ..Default::default()
        }),
        update_health: true,
        ..Default::default()
    };
    client
        .clusters()
        .update_cluster(health)
        .await
        .expect("health");
    let held = "(document.getElementById('remediation-message') || {}).textContent || ''";
    until(&mut browser, held, WAIT, &mut seen, |v| {
        v.as_str()
            .is_some_and(|t| t.starts_with("paused: unhealthy nodes"))
    })
    .await;
    let health = "[...document.querySelectorAll('.node-health')].map(e => e.textContent).join()";
    until(&mut browser, health, WAIT, &mut seen, |v| {
        v.as_str()
            .is_some_and(|t| t.starts_with("unhealthy: not ready for"))
    })
    .await;
    backends.sim.set_health(&web.uid, true).await;
    let named = "Recover cluster web:";
    confirm(&mut browser, "action-recover", named, "Recover: done.").await;
    wait_for_state(&client, "web", v1::ClusterState::Running, WAIT).await;

    // A running upgrade, cancelled from its cluster's page.
    backends.sim.set_latency(Duration::from_millis(1500)).await;
    let op = upgrade(&mut client, "db").await;
    wait_running(&client, "db", &op.id, WAIT).await;
    browser.eval("location.hash = '#/clusters/db'; true");
    let named = format!("Cancel operation {} (UPGRADE) on cluster db:", op.id);
    confirm(
        &mut browser,
        "action-cancel",
        &named,
        "Cancel UPGRADE: done.",
    )
    .await;
    let done = client.wait_operation(&op, WAIT).await.unwrap();
    assert_eq!(done.state, O::Cancelled as i32, "{done:?}");
    // Cancelled mid-upgrade, the cluster is Alert until the scanner has
    // recovered it.
    wait_for_state(&client, "db", v1::ClusterState::Running, WAIT).await;

    // The running operations of team=a, cancelled together.
    let (on_web, on_db) = (
        upgrade(&mut client, "web").await,
        upgrade(&mut client, "db").await,
    );
    let on_cache = upgrade(&mut client, "cache").await;
    for (cluster, op) in [("web", &on_web), ("db", &on_db), ("cache", &on_cache)] {
        wait_running(&client, cluster, &op.id, WAIT).await;
    }
    browser.eval("location.hash = '#/?label=team%3Da'; true");
    let named = "Cancel the 2 running operations of the clusters labelled team=a: db, web.";
    confirm(&mut browser, "bulk-cancel", named, "Cancelled 2 of 2.").await;
    for op in [&on_web, &on_db] {
        let done = client.wait_operation(op, WAIT).await.unwrap();
        assert_eq!(done.state, O::Cancelled as i32, "{done:?}");
    }
    backends.sim.set_latency(Duration::ZERO).await;
    let done = client.wait_operation(&on_cache, WAIT).await.unwrap();
    assert_eq!(
        done.state,
        O::Succeeded as i32,
        "team=b was not picked: {done:?}"
    );
    // A bulk cancel whose count is stale cancels nothing.
    let stale = Some(("application/json", r#"{"count":5}"#));
    let path = "/ui/api/bulk/cancel?label=team%3Da";
    let (status, body) = http(&admin, "POST", path, OPERATOR, stale);
    assert_eq!(status, 409, "{body}");
    assert_audited(&audit_log, &op.id, [&on_web.id, &on_db.id]);
    drop(replica);
}

/// The console's actions and refusals are in the audit log as the gRPC
/// API's are: who (the token's name and role), what, on which cluster,
/// and how it ended.
fn assert_audited(log: &std::path::Path, cancelled: &str, bulk: [&str; 2]) {
    let text = std::fs::read_to_string(log).expect("the audit log");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect();
    let line = |method: &str, cluster: &str, name: &str, outcome: &str| {
        let method = format!("/drover.v1.{method}");
        lines
            .iter()
            .filter(|l| {
                l["method"] == method.as_str()
                    && l["cluster"] == cluster
                    && l["caller"]["name"] == name
                    && l["outcome"] == outcome
            })
            .count()
    };
    assert_eq!(
        line("Clusters/UpdateCluster", "web", "dash", "refused"),
        1,
        "{text}"
    );
    // Its labels and health policy (through the API), then the pause and
    // the suspension.
    assert_eq!(
        line("Clusters/UpdateCluster", "web", "ci", "accepted"),
        4,
        "{text}"
    );
    let cancels: Vec<&str> = lines
        .iter()
        .filter(|l| l["method"] == "/drover.v1.Operations/CancelOperation")
        .filter_map(|l| l["operation_id"].as_str())
        .collect();
    for id in [cancelled, bulk[0], bulk[1]] {
        assert_eq!(cancels.iter().filter(|c| **c == id).count(), 1, "{text}");
    }
    let recovered = line("Clusters/RecoverCluster", "web", "ci", "accepted");
    assert_eq!(recovered, 1, "{text}");
    assert!(
        !text.contains(OPERATOR) && !text.contains(VIEWER),
        "no token in the log"
    );
}
