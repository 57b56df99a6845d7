//! The deploy kit as shipped: the Kubernetes manifests pass a schema check
//! and carry the hardening and consistency PRODUCTION.md promises, and the
//! systemd units verify and stay sandboxed.

use drover_tests::workspace_binary;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `drain` the replica adds after the hand-off grace (shutdown.rs).
const DRAIN_SECONDS: u64 = drover_server::shutdown::DRAIN_GRACE.as_secs();
/// What the pod's grace must leave beyond hand-off and drain.
const MARGIN_SECONDS: u64 = 10;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Runs a tool the test needs; its absence fails the test with where to
/// get it.
fn run(program: &Path, args: &[&str], from: &str) -> Output {
    Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; it comes from {from}", program.display()))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

const MANIFESTS: [&str; 2] = [
    "deploy/kubernetes/drover.yaml",
    "deploy/kubernetes/etcd.yaml",
];
const VENV: &str = "scripts/install-deps.sh (into .venv)";

#[test]
fn the_kubernetes_manifests_pass_the_schema_check() {
    let validate = root().join(".venv/bin/kubernetes-validate");
    let mut args = vec!["--strict"];
    args.extend(MANIFESTS);
    let output = run(&validate, &args, VENV);
    assert!(output.status.success(), "{}", text(&output));
}

/// Every document of every manifest, as JSON (PyYAML from the same .venv).
fn documents() -> Vec<Value> {
    let python = root().join(".venv/bin/python3");
    let script = "import json, sys, yaml\n\
        docs = [d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]\n\
        print(json.dumps(docs))";
    let mut args = vec!["-c", script];
    args.extend(MANIFESTS);
    let output = run(&python, &args, VENV);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).expect("JSON")
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or("?")
}

/// The pod-level and container-level hardening of one workload.
fn check_pod(workload: &Value) {
    let who = name(workload);
    let pod = &workload["spec"]["template"]["spec"];
    let security = &pod["securityContext"];
    assert_eq!(security["runAsNonRoot"], true, "{who}: runAsNonRoot");
    assert_eq!(
        security["seccompProfile"]["type"], "RuntimeDefault",
        "{who}: seccomp"
    );
    for container in pod["containers"].as_array().expect("containers") {
        let c = &container["securityContext"];
        assert_eq!(c["allowPrivilegeEscalation"], false, "{who}: escalation");
        assert_eq!(c["readOnlyRootFilesystem"], true, "{who}: read-only root");
        assert_eq!(
            c["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{who}: caps"
        );
        for probe in ["livenessProbe", "readinessProbe"] {
            assert!(container[probe].is_object(), "{who}: {probe}");
        }
        let resources = &container["resources"];
        assert!(
            resources["requests"]["cpu"].is_string(),
            "{who}: cpu request"
        );
        assert!(
            resources["limits"]["memory"].is_string(),
            "{who}: memory limit"
        );
    }
}

/// A workload of several replicas is spread over nodes and covered by a
/// disruption budget selecting its pods.
fn check_spread(workload: &Value, budgets: &[&Value]) {
    let who = name(workload);
    let pod = &workload["spec"]["template"]["spec"];
    let spread = pod["topologySpreadConstraints"]
        .as_array()
        .is_some_and(|c| {
            c.iter()
                .any(|c| c["topologyKey"] == "kubernetes.io/hostname")
        });
    let anti = pod["affinity"]["podAntiAffinity"].is_object();
    assert!(spread || anti, "{who}: not spread over nodes");
    let labels = &workload["spec"]["template"]["metadata"]["labels"];
    let covered = budgets
        .iter()
        .any(|b| b["spec"]["selector"]["matchLabels"] == *labels);
    assert!(covered, "{who}: no PodDisruptionBudget selects {labels}");
}

#[test]
fn the_kubernetes_workloads_are_hardened_spread_and_budgeted() {
    let docs = documents();
    let budgets = of_kind(&docs, "PodDisruptionBudget");
    let mut workloads = of_kind(&docs, "Deployment");
    workloads.extend(of_kind(&docs, "StatefulSet"));
    assert!(workloads.len() >= 3, "drover, its provider and etcd");
    for workload in workloads {
        check_pod(workload);
        if workload["spec"]["replicas"].as_u64().unwrap_or(1) > 1 {
            check_spread(workload, &budgets);
        }
    }
}

/// `key = value` of the drover.toml the ConfigMap carries.
fn setting<'a>(toml: &'a str, key: &str) -> Option<&'a str> {
    toml.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

#[test]
fn drover_reads_its_secrets_and_outlives_its_hand_off_on_kubernetes() {
    let docs = documents();
    let config = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|c| name(c) == "drover")
        .expect("the drover ConfigMap");
    let toml = config["data"]["drover.toml"].as_str().expect("drover.toml");
    let deployment = of_kind(&docs, "Deployment")
        .into_iter()
        .find(|d| name(d) == "drover")
        .expect("the drover Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];

    // Every secret file the config names lies in a mounted Secret.
    let secret_volumes: Vec<&str> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter(|v| v["secret"].is_object())
        .filter_map(|v| v["name"].as_str())
        .collect();
    let secret_mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter(|m| secret_volumes.contains(&m["name"].as_str().unwrap_or("")))
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    for key in ["tls_cert", "tls_key", "auth_tokens"] {
        let path = setting(toml, key).unwrap_or_else(|| panic!("{key} in drover.toml"));
        assert!(
            secret_mounts
                .iter()
                .any(|m| path.starts_with(&format!("{m}/"))),
            "{key} = {path} is in no mounted Secret ({secret_mounts:?})"
        );
    }

    // The pod's grace covers the hand-off, the drain and a margin.
    let handoff: u64 = setting(toml, "handoff_grace")
        .expect("handoff_grace in drover.toml")
        .parse()
        .expect("seconds");
    let grace = pod["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace");
    assert!(
        grace >= handoff + DRAIN_SECONDS + MARGIN_SECONDS,
        "terminationGracePeriodSeconds {grace} < handoff_grace {handoff} + {DRAIN_SECONDS} s drain + {MARGIN_SECONDS} s"
    );

    // The provider the config names is a Service of these manifests, in
    // front of a Deployment.
    let provider = setting(toml, "provider").expect("provider");
    let authority = provider.trim_start_matches("http://");
    let (host, port) = authority.split_once(':').expect("host:port");
    let port: u64 = port.parse().expect("a port number");
    let service = of_kind(&docs, "Service")
        .into_iter()
        .find(|s| name(s) == host)
        .unwrap_or_else(|| panic!("no Service {host} for provider {provider}"));
    assert!(service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["port"] == port));
    let selector = &service["spec"]["selector"];
    assert!(
        of_kind(&docs, "Deployment")
            .iter()
            .any(|d| d["spec"]["template"]["metadata"]["labels"] == *selector),
        "no Deployment behind the {host} Service"
    );
}

/// The unit with its ExecStart pointing at the built binary, so that
/// `systemd-analyze verify` checks the rest of it.
fn unit_for_verify(dir: &Path, unit: &str, binary: &str) -> PathBuf {
    let text = std::fs::read_to_string(root().join("deploy/systemd").join(unit)).unwrap();
    let installed = format!("/usr/local/bin/{binary}");
    let built = workspace_binary(binary).to_string_lossy().to_string();
    let path = dir.join(unit);
    std::fs::write(&path, text.replace(&installed, &built)).unwrap();
    path
}

#[test]
fn the_systemd_units_verify_and_are_sandboxed() {
    let dir = drover_tests::TempDir::new("units");
    let analyze = Path::new("systemd-analyze");
    for (unit, binary) in [
        ("drover.service", "drover"),
        ("drover-sim-provider.service", "drover-sim-provider"),
    ] {
        let path = unit_for_verify(dir.path(), unit, binary);
        let path = path.to_string_lossy();
        let verified = run(analyze, &["verify", "--man=no", &path], "systemd");
        let said = text(&verified);
        assert!(
            verified.status.success() && said.trim().is_empty(),
            "{unit}: {said}"
        );
        let security = run(analyze, &["security", "--offline=true", &path], "systemd");
        let said = text(&security);
        let exposure: f64 = said
            .lines()
            .find_map(|l| {
                l.split_once("Overall exposure level for ")?
                    .1
                    .split_once(": ")
            })
            .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("{unit}: no exposure level in\n{said}"));
        assert!(exposure <= 2.0, "{unit}: exposure {exposure}\n{said}");
    }
    let unit = std::fs::read_to_string(root().join("deploy/systemd/drover.service")).unwrap();
    assert!(unit.contains("EnvironmentFile=-/etc/drover/drover.env"));
    let sysusers = std::fs::read_to_string(root().join("deploy/systemd/drover.sysusers.conf"));
    assert!(sysusers.expect("sysusers file").contains("u drover "));
}
