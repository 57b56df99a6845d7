//! The web console in a real browser: headless Chromium (DevTools
//! protocol) against a real replica with tokens, a real etcd and the
//! simulator. A viewer signs in through the form and sees the fleet; the
//! cluster page follows an upgrade step by step without a reload and
//! shows its end; a caller without a token is refused. Screenshots of the
//! fleet and cluster pages go to `target/console-screenshots/`.

use drover_client::{v1, Client, ConnectOptions};
use drover_tests::browser::{self, screenshots, until, Browser};
use drover_tests::fixture::Backends;
use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_running, http_get, TempDir};
use std::collections::BTreeSet;
use std::time::Duration;

const VIEWER: &str = "viewer-token-1";
const OPERATOR: &str = "operator-token-2";

#[tokio::test]
async fn the_console_shows_an_upgrade_moving_to_a_signed_in_viewer() {
    if !browser::available() {
        panic!("chromium is missing: run scripts/install-deps.sh");
    }
    let Backends { sim, etcd } = Backends::start().await;
    let dir = TempDir::new("console");
    let tokens = [("dash", "viewer", VIEWER), ("ci", "operator", OPERATOR)];
    let token_file = drover_tests::console::token_file(dir.path(), &tokens);
    let args = [
        "--provider",
        &sim.endpoint(),
        "--auth-tokens",
        token_file.to_str().expect("a UTF-8 path"),
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
    create_running(&mut client, "web", 2).await;
    create_running(&mut client, "db", 1).await;

    // No token, or a wrong one: refused.
    let admin = replica.admin_endpoint();
    assert_eq!(http_get(&admin, "/ui/api/fleet").0, 401);
    assert_eq!(http_get(&admin, "/ui/").0, 200, "the page itself is open");

    let mut browser = Browser::start();
    let mut seen = Vec::new();
    browser.navigate(&format!("{admin}/ui/"));
    let login = "!document.getElementById('login').hidden";
    until(
        &mut browser,
        login,
        Duration::from_secs(10),
        &mut seen,
        |v| v == true,
    )
    .await;
    // A viewer signs in through the form.
    browser.eval(&format!(
        "document.getElementById('token').value = '{VIEWER}'; \
         document.getElementById('login').requestSubmit(); true"
    ));
    let rows = "Number(document.body.dataset.fleetRows || 0)";
    until(
        &mut browser,
        rows,
        Duration::from_secs(10),
        &mut seen,
        |v| v == 2,
    )
    .await;
    let stored = browser.eval("sessionStorage.getItem('drover.token')");
    assert_eq!(stored, VIEWER, "the token is kept in the session");
    let fleet_ms = browser.eval("Number(document.body.dataset.fleetMs)");
    println!("fleet page fetched and rendered in {fleet_ms} ms");
    let live = "document.getElementById('live').textContent";
    until(
        &mut browser,
        live,
        Duration::from_secs(10),
        &mut seen,
        |v| v == "live",
    )
    .await;
    std::fs::write(screenshots().join("fleet.png"), browser.screenshot()).expect("save");

    browser.eval("location.hash = '#/clusters/web'; true");
    let state = "(document.getElementById('cluster-state') || {}).textContent || ''";
    until(
        &mut browser,
        state,
        Duration::from_secs(10),
        &mut seen,
        |v| v == "RUNNING",
    )
    .await;

    // An upgrade slow enough to watch: every provider step takes a while.
    sim.set_latency(Duration::from_millis(700)).await;
    let upgrade = v1::UpgradeClusterRequest {
        name: "web".into(),
        version: "1.30.0".into(),
        request_id: String::new(),
        allow_downgrade: false,
        ..Default::default()
    };
    client
        .clusters()
        .upgrade_cluster(upgrade)
        .await
        .expect("upgrade accepted");
    let current = "document.getElementById('current-operation').textContent";
    let mut steps = Vec::new();
    let moving = |v: &serde_json::Value| v.as_str().is_some_and(|t| t.contains("UPGRADE 2/"));
    until(
        &mut browser,
        current,
        Duration::from_secs(30),
        &mut steps,
        moving,
    )
    .await;
    std::fs::write(screenshots().join("cluster.png"), browser.screenshot()).expect("save");
    let idle = |v: &serde_json::Value| v == "no operation running";
    until(
        &mut browser,
        current,
        Duration::from_secs(60),
        &mut steps,
        idle,
    )
    .await;
    let shown: BTreeSet<&str> = steps
        .iter()
        .filter_map(|v| v.as_str())
        .filter(|t| t.starts_with("UPGRADE"))
        .collect();
    assert!(
        shown.len() >= 2,
        "the page showed the steps moving: {steps:?}"
    );
    until(
        &mut browser,
        state,
        Duration::from_secs(10),
        &mut seen,
        |v| v == "RUNNING",
    )
    .await;
    let version = "document.getElementById('current-version').textContent";
    until(
        &mut browser,
        version,
        Duration::from_secs(10),
        &mut seen,
        |v| v == "1.30.0",
    )
    .await;
    let history = "document.getElementById('timeline').textContent";
    let history = browser.eval(history);
    assert!(
        history.as_str().is_some_and(|h| h.contains("UPGRADING")),
        "{history}"
    );
    println!("the page showed: {shown:?}");
    // Members need admin: the viewer is told so, not shown them.
    browser.eval("location.hash = '#/members'; true");
    let text = "document.getElementById('main').textContent";
    let denied = |v: &serde_json::Value| v.as_str().is_some_and(|t| t.contains("403"));
    until(
        &mut browser,
        text,
        Duration::from_secs(10),
        &mut seen,
        denied,
    )
    .await;
}
