//! The console's rollout pages in a real browser: headless Chromium against
//! a real replica with a viewer and an operator token, a real etcd and the
//! simulator. A rollout waits at an approval gate: the viewer sees its
//! stages and no action, and the API refuses the viewer's approve; a POST
//! that is not JSON changes nothing; the operator approves through the
//! page (button, then the confirmation) and the rollout, read through the
//! gRPC API, goes on to SUCCEEDED. Screenshots of the rollout before and
//! after go to `target/console-screenshots/`.

use drover_client::{v1, Client, ConnectOptions};
use drover_tests::browser::{self, screenshots, until, Browser};
use drover_tests::console::{self, http};
use drover_tests::fixture::Backends;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, TempDir};
use std::path::PathBuf;
use std::time::Duration;

const VIEWER: &str = "viewer-token-1";
const OPERATOR: &str = "operator-token-2";
const ROLLOUT: &str = "r131";
const WAIT: Duration = Duration::from_secs(60);

/// A token file with [`VIEWER`] and [`OPERATOR`], written into `dir`.
fn token_file(dir: &TempDir) -> PathBuf {
    console::token_file(
        dir.path(),
        &[("dash", "viewer", VIEWER), ("ci", "operator", OPERATOR)],
    )
}

/// Three running clusters and a rollout of them whose one stage needs an
/// approval.
async fn gated_rollout(client: &mut Client) {
    let names = ["web", "db", "cache"];
    for name in names {
        create_running(client, name, 1).await;
    }
    let spec = v1::RolloutSpec {
        clusters: names.iter().map(|n| n.to_string()).collect(),
        version: "1.30.0".into(),
        stages: vec![v1::RolloutStage {
            name: "fleet".into(),
            max_concurrency: "2".into(),
            approval_required: true,
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = v1::CreateRolloutRequest {
        name: ROLLOUT.into(),
        spec: Some(spec),
    };
    let created = client.rollouts().create_rollout(request).await;
    created.expect("rollout created");
}

/// Polls the rollout's state through the gRPC API until it is `state`.
async fn wait_state(client: &mut Client, state: v1::RolloutState) -> v1::Rollout {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let request = v1::GetRolloutRequest {
            name: ROLLOUT.into(),
        };
        let rollout = client.rollouts().get_rollout(request).await;
        let rollout = rollout.expect("get the rollout").into_inner();
        let now = rollout.status.as_ref().map(|s| s.state);
        if now == Some(state as i32) {
            return rollout;
        }
        let late = tokio::time::Instant::now() > deadline;
        assert!(!late, "{ROLLOUT} never {state:?}: {rollout:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The API refuses what the viewer and a form may not do.
async fn refusals(admin: &str, client: &mut Client) {
    let page = format!("/ui/api/rollouts/{ROLLOUT}");
    let (status, body) = http(admin, "GET", &page, VIEWER, None);
    assert_eq!(status, 200, "{body}");
    let shown: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(shown["actions"], serde_json::json!([]), "{body}");
    assert_eq!(
        shown["rollout"]["status"]["state"],
        "ROLLOUT_WAITING_APPROVAL"
    );
    let approve = format!("{page}/approve");
    let stage = Some(("application/json", r#"{"stage":"fleet"}"#));
    let (status, body) = http(admin, "POST", &approve, VIEWER, stage);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("PermissionDenied"), "{body}");
    // What a cross-site HTML form could send, with the operator's token.
    let form = Some(("application/x-www-form-urlencoded", "stage=fleet"));
    let (status, body) = http(admin, "POST", &approve, OPERATOR, form);
    assert_eq!(status, 415, "{body}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rollout = wait_state(client, v1::RolloutState::RolloutWaitingApproval).await;
    let stages = rollout.status.expect("a status").stages;
    assert_eq!(
        (stages[0].pending, stages[0].running),
        (3, 0),
        "nothing started"
    );
}

async fn sign_in(browser: &mut Browser, token: &str) {
    console::sign_in(browser, token, WAIT).await;
}

/// The viewer sees the list and the rollout page: its stage, no buttons.
async fn viewer_sees_no_actions(browser: &mut Browser, admin: &str) {
    let mut seen = Vec::new();
    browser.navigate(&format!("{admin}/ui/#/rollouts"));
    sign_in(browser, VIEWER).await;
    let list = "document.getElementById('main').textContent";
    let listed = |v: &serde_json::Value| v.as_str().is_some_and(|t| t.contains("0/3"));
    until(browser, list, WAIT, &mut seen, listed).await;
    browser.eval(&format!("location.hash = '#/rollouts/{ROLLOUT}'; true"));
    let state = "(document.getElementById('rollout-state') || {}).textContent || ''";
    until(browser, state, WAIT, &mut seen, |v| v == "WAITING_APPROVAL").await;
    let stages = browser.eval("document.getElementById('rollout-stages').textContent");
    assert!(
        stages.as_str().is_some_and(|t| t.contains("fleet")),
        "{stages}"
    );
    let message = browser.eval("document.getElementById('rollout-message').textContent");
    assert!(
        message.as_str().is_some_and(|t| t.contains("approval")),
        "{message}"
    );
    let buttons = browser.eval("document.querySelectorAll('#rollout-actions button').length");
    assert_eq!(buttons, 0, "a viewer is shown no action");
}

/// The operator approves through the page: the button, then the dialog.
async fn operator_approves(browser: &mut Browser) {
    let mut seen = Vec::new();
    browser.eval("document.getElementById('logout').click(); true");
    sign_in(browser, OPERATOR).await;
    let button = "(document.getElementById('action-approve') || {}).textContent || ''";
    until(browser, button, WAIT, &mut seen, |v| {
        v == "Approve stage fleet"
    })
    .await;
    let others = "[...document.querySelectorAll('#rollout-actions button')].map(b => b.id).join()";
    assert_eq!(
        browser.eval(others),
        "action-pause,action-approve,action-cancel"
    );
    std::fs::write(screenshots().join("rollout.png"), browser.screenshot()).expect("save");
    browser.eval("document.getElementById('action-approve').click(); true");
    let dialog = "document.getElementById('confirm').open";
    until(browser, dialog, WAIT, &mut seen, |v| v == true).await;
    let text = browser.eval("document.getElementById('confirm-text').textContent");
    let named = format!("Approve stage fleet of rollout {ROLLOUT}: its 3 clusters start");
    assert!(
        text.as_str().is_some_and(|t| t.starts_with(&named)),
        "{text}"
    );
    browser.eval("document.getElementById('confirm-ok').click(); true");
    let result = "document.getElementById('action-result').textContent";
    until(browser, result, WAIT, &mut seen, |v| {
        v == "Approve stage fleet: done."
    })
    .await;
}

#[tokio::test]
async fn an_operator_approves_a_rollout_that_a_viewer_only_sees() {
    if !browser::available() {
        panic!("chromium is missing: run scripts/install-deps.sh");
    }
    let Backends { sim, etcd } = Backends::start().await;
    let dir = TempDir::new("console-rollouts");
    let tokens = token_file(&dir);
    let args = [
        "--provider",
        &sim.endpoint(),
        "--auth-tokens",
        tokens.to_str().expect("a UTF-8 path"),
    ];
    let replica = ReplicaProcess::serve_with(&etcd.endpoint(), "r1", &args).await;
    let options = ConnectOptions {
        tls: None,
        token: Some(OPERATOR.into()),
        ..Default::default()
    };
    let mut client = Client::connect_with(&replica.endpoint(), &options)
        .await
        .expect("connect");
    gated_rollout(&mut client).await;
    wait_state(&mut client, v1::RolloutState::RolloutWaitingApproval).await;
    let admin = replica.admin_endpoint();
    refusals(&admin, &mut client).await;

    let mut browser = Browser::start();
    viewer_sees_no_actions(&mut browser, &admin).await;
    operator_approves(&mut browser).await;
    let done = wait_state(&mut client, v1::RolloutState::RolloutSucceeded).await;
    let stages = done.status.expect("a status").stages;
    assert_eq!(stages[0].succeeded, 3, "{stages:?}");
    let mut seen = Vec::new();
    let state = "document.getElementById('rollout-state').textContent";
    until(&mut browser, state, WAIT, &mut seen, |v| v == "SUCCEEDED").await;
    let buttons = browser.eval("document.querySelectorAll('#rollout-actions button').length");
    assert_eq!(buttons, 0, "an ended rollout takes no action");
    let saved = screenshots().join("rollout-succeeded.png");
    std::fs::write(saved, browser.screenshot()).expect("save");
}
