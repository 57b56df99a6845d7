//! A cluster's health policy and upgrade policy from the command line:
//! `droverctl cluster create|update --health KEY=VALUE,...
//! --upgrade-policy KEY=VALUE,...` (and `--no-health`,
//! `--no-upgrade-policy` on update) set `spec.health` and
//! `spec.upgrade_policy`, each as a whole; a bad key or value is a usage
//! error naming it, and nothing is sent.

use drover_client::v1;
use drover_tests::create_only;
use drover_tests::fixture::Fixture;
use std::process::Output;

fn droverctl(f: &Fixture, args: &[&str]) -> Output {
    std::process::Command::new(drover_tests::workspace_binary("droverctl"))
        .args(["--endpoint", &f.replicas[0].endpoint()])
        .args(args)
        .output()
        .expect("droverctl runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `droverctl cluster describe NAME`'s page.
fn described(f: &Fixture, name: &str) -> String {
    let out = droverctl(f, &["cluster", "describe", name]);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs droverctl with `args`, which must fail with exit `code` saying
/// `says` on standard error.
fn refused(f: &Fixture, args: &[&str], code: i32, says: &str) {
    let out = droverctl(f, args);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {out:?}");
    assert!(stderr(&out).contains(says), "{args:?}: {out:?}");
}

async fn spec_of(f: &mut Fixture, name: &str) -> (i64, v1::ClusterSpec) {
    let cluster = f.client.get_cluster(name).await.expect("cluster read");
    (cluster.generation, cluster.spec.expect("a spec"))
}

#[tokio::test]
async fn update_sets_the_health_policy_and_refuses_a_bad_key_before_sending() {
    let mut f = Fixture::builder().start().await;
    let created = f.client.clusters().create_cluster(create_only("healthy"));
    created.await.expect("created");
    let (generation, _) = spec_of(&mut f, "healthy").await;

    let health = "unhealthy_timeout_seconds=120,remediation=replace";
    let out = droverctl(&f, &["cluster", "update", "healthy", "--health", health]);
    assert!(out.status.success(), "{out:?}");
    let (updated, spec) = spec_of(&mut f, "healthy").await;
    assert_eq!(updated, generation + 1, "an edit of the spec");
    let expected = v1::HealthPolicy {
        unhealthy_timeout_seconds: Some(120),
        remediation: "replace".into(),
        ..Default::default()
    };
    assert_eq!(spec.health, Some(expected.clone()));
    let page = described(&f, "healthy");
    assert!(page.contains("Health policy:"), "{page}");
    assert!(page.contains(health), "{page}");
    assert!(!page.contains("Upgrade policy:"), "none set: {page}");

    // An unknown key and a word for a number: usage errors (exit 2) naming
    // the key, before any call; a value the server refuses: invalid
    // argument (exit 5) naming its field. The cluster is as it was.
    let update = ["cluster", "update", "healthy"];
    let health = |value| [&update[..], &["--health", value]].concat();
    let key = "unknown key \"unhealthy_timeout\"";
    refused(&f, &health("unhealthy_timeout=60"), 2, key);
    refused(&f, &health("max_retry=three"), 2, "max_retry: \"three\"");
    let surge = [&update[..], &["--upgrade-policy", "surge=1"]].concat();
    refused(&f, &surge, 2, "unknown key \"surge\"");
    refused(&f, &health("max_in_flight=0"), 5, "health.max_in_flight");
    let (unchanged, spec) = spec_of(&mut f, "healthy").await;
    assert_eq!(unchanged, generation + 1, "refusals wrote nothing");
    assert_eq!(spec.health, Some(expected));

    // The policy is replaced as a whole: the keys not given are unset.
    let out = droverctl(&f, &health("max_retry=0"));
    assert!(out.status.success(), "{out:?}");
    let (_, spec) = spec_of(&mut f, "healthy").await;
    let replaced = v1::HealthPolicy {
        max_retry: Some(0),
        ..Default::default()
    };
    assert_eq!(spec.health, Some(replaced));
    // --no-health: back to the defaults, an empty policy.
    let out = droverctl(&f, &["cluster", "update", "healthy", "--no-health"]);
    assert!(out.status.success(), "{out:?}");
    let (_, spec) = spec_of(&mut f, "healthy").await;
    assert_eq!(spec.health.unwrap_or_default(), v1::HealthPolicy::default());
    let page = described(&f, "healthy");
    assert!(!page.contains("Health policy:"), "{page}");
}

#[tokio::test]
async fn an_upgrade_policy_given_at_create_lands_in_the_spec() {
    let mut f = Fixture::builder().start().await;
    let out = droverctl(
        &f,
        &[
            "cluster",
            "create",
            "surged",
            "--version",
            "1.29.0",
            "--offering",
            "small",
            "--upgrade-policy",
            "max_surge=1",
            "--health",
            "max_unhealthy=2",
            "--create-only",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let (generation, spec) = spec_of(&mut f, "surged").await;
    let upgrade = v1::UpgradePolicy {
        max_surge: Some(1),
        ..Default::default()
    };
    assert_eq!(spec.upgrade_policy, Some(upgrade));
    let health = spec.health.unwrap_or_default();
    assert_eq!(health.max_unhealthy, "2");
    let page = described(&f, "surged");
    assert!(page.contains("Upgrade policy:"), "{page}");
    assert!(page.contains("max_surge=1"), "{page}");
    assert!(page.contains("max_unhealthy=2"), "{page}");

    // A bad key at create: nothing is created.
    let create = ["cluster", "create", "refused", "--version", "1.29.0"];
    let policy = ["--upgrade-policy", "max_surge=1,step_timeout=5"];
    let key = "unknown key \"step_timeout\"";
    refused(&f, &[&create[..], &policy].concat(), 2, key);
    let missing = f.client.get_cluster("refused").await.unwrap_err();
    assert!(
        matches!(&missing, drover_client::ClientError::Status(s) if s.code() == tonic::Code::NotFound),
        "{missing:?}"
    );

    // --no-upgrade-policy on update: back to the defaults; the health
    // policy stays.
    let out = droverctl(&f, &["cluster", "update", "surged", "--no-upgrade-policy"]);
    assert!(out.status.success(), "{out:?}");
    let (updated, spec) = spec_of(&mut f, "surged").await;
    assert_eq!(updated, generation + 1);
    let policy = spec.upgrade_policy.unwrap_or_default();
    assert_eq!(policy, v1::UpgradePolicy::default());
    assert_eq!(spec.health.unwrap_or_default().max_unhealthy, "2", "kept");
}
