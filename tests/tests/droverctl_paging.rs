//! `droverctl cluster list` over many pages: every page printed as it
//! arrives, in key order, the table's header once, `-o json` one JSON array
//! and `-o yaml` one YAML sequence however many pages; Destroyed clusters
//! hidden page by page.

use drover_tests::replica::ReplicaProcess;
use drover_tests::{create_only, workspace_binary};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs droverctl against `endpoint` and returns its standard output,
/// failing the test if it fails.
fn ctl(endpoint: &str, args: &[&str]) -> String {
    let out: Output = Command::new(workspace_binary("droverctl"))
        .args(["--endpoint", endpoint])
        .args(args)
        .env_remove("DROVER_TOKEN")
        .env_remove("DROVER_TOKEN_FILE")
        .output()
        .expect("run droverctl");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Seven clusters, two of them Destroyed; by two a page, the listing's
/// pages are [p1 p2] [p3-gone p4-gone] [p5 p6] [p7]: one page has nothing
/// to show, one is short.
#[tokio::test]
async fn cluster_list_prints_every_page_in_order_with_one_header_and_one_document() {
    let replica = ReplicaProcess::dev().await;
    let endpoint = replica.endpoint();
    let mut client = replica.client().await;
    for name in ["p1", "p2", "p3-gone", "p4-gone", "p5", "p6", "p7"] {
        client
            .create_cluster(create_only(name))
            .await
            .expect("create");
    }
    for gone in ["p3-gone", "p4-gone"] {
        ctl(&endpoint, &["cluster", "delete", gone, "--wait"]);
    }
    let shown = ["p1", "p2", "p5", "p6", "p7"];
    let list = |format: &str, more: &[&str]| {
        let args = [&["-o", format, "cluster", "list", "--page-size", "2"], more].concat();
        ctl(&endpoint, &args)
    };

    let table = list("table", &[]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    assert_eq!(table.matches("NAME").count(), 1, "one header:\n{table}");
    let names: Vec<&str> = lines[1..]
        .iter()
        .map(|line| line.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, shown, "{table}");
    // Every page lines up under the header.
    let state_at = lines[0].find("STATE").unwrap();
    for line in &lines[1..] {
        assert_eq!(line.find("CREATED"), Some(state_at), "{table}");
    }

    let json: serde_json::Value = serde_json::from_str(&list("json", &[])).expect("one JSON array");
    let names: Vec<&str> = json
        .as_array()
        .expect("an array")
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, shown);

    // One sequence: an item starts each unindented line.
    let yaml = list("yaml", &[]);
    let items = yaml.lines().filter(|line| !line.starts_with(' '));
    assert!(items.clone().all(|line| line.starts_with("- ")), "{yaml}");
    assert_eq!(items.count(), shown.len(), "{yaml}");
    for name in shown {
        assert!(
            yaml.contains(&format!("name: {name}\n")),
            "{name} in\n{yaml}"
        );
    }

    let all = list("name", &["--all"]);
    assert_eq!(all, "p1\np2\np3-gone\np4-gone\np5\np6\np7\n");
    let none = ["-l", "team=nobody"];
    assert_eq!(list("json", &none).trim(), "[]");
    assert_eq!(list("yaml", &none).trim(), "[]");
    assert_eq!(list("table", &none).lines().count(), 1, "the header alone");
}

/// A page is printed before the next is asked for: with droverctl's
/// output unread beyond its first byte (the first page's JSON, some 190
/// KB, is larger than a pipe holds, 64 KiB, so droverctl waits on the pipe
/// with it) the replica goes away; droverctl has printed the first page's
/// clusters and fails asking for the second (once its retries, some 15 s,
/// give up). Listing everything before printing anything would print it
/// all and succeed.
#[tokio::test]
async fn cluster_list_prints_a_page_before_asking_for_the_next() {
    let mut replica = ReplicaProcess::dev().await;
    let mut client = replica.client().await;
    for i in 0..250 {
        let request = create_only(&format!("bulk-{i:03}"));
        client.create_cluster(request).await.expect("create");
    }
    let mut child = Command::new(workspace_binary("droverctl"))
        .args(["--endpoint", &replica.endpoint()])
        .args(["-o", "json", "cluster", "list", "--page-size", "200"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run droverctl");
    let mut stdout = child.stdout.take().expect("piped stdout");
    let first = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut byte = [0u8; 1];
        stdout.read_exact(&mut byte).expect("a first byte");
        stdout
    });
    let mut stdout = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("droverctl prints")
        .unwrap();
    replica.kill9();
    let out = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).expect("UTF-8");
        (rest, child.wait_with_output().expect("droverctl's status"))
    });
    let (printed, out) = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .expect("droverctl ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "unavailable: {stderr}");
    for i in 0..200 {
        let name = format!("\"name\": \"bulk-{i:03}\"");
        assert!(printed.contains(&name), "{name} printed");
    }
    assert!(!printed.contains("bulk-200"), "the second page never came");
}

/// `droverctl watch` and `cluster list --watch` begin with the clusters
/// as they are (Destroyed hidden), printed page by page, then go on with
/// the changes after the listing.
#[tokio::test]
async fn watches_begin_with_every_cluster_then_go_on() {
    let replica = ReplicaProcess::dev().await;
    let endpoint = replica.endpoint();
    let mut client = replica.client().await;
    for name in ["w1", "w2", "w3-gone", "w4"] {
        client
            .create_cluster(create_only(name))
            .await
            .expect("create");
    }
    ctl(&endpoint, &["cluster", "delete", "w3-gone", "--wait"]);
    let list = ["cluster", "list", "--watch", "--page-size", "2"];
    let watches: [&[&str]; 2] = [&list, &["watch"]];
    let mut current = vec!["w1".to_string(), "w2".into(), "w4".into()];
    for (i, args) in watches.into_iter().enumerate() {
        let mut child = Command::new(workspace_binary("droverctl"))
            .args(["--endpoint", &endpoint, "-o", "name"])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("run droverctl");
        let lines = lines_of(child.stdout.take().expect("piped stdout"));
        let next = || {
            lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("{args:?}: no line: {e}"))
        };
        let shown: Vec<String> = current.iter().map(|_| next()).collect();
        assert_eq!(shown, current, "{args:?}");
        let after = format!("after-{i}");
        client
            .create_cluster(create_only(&after))
            .await
            .expect("create");
        assert_eq!(next(), after, "{args:?}");
        // The next watch begins with it, first in key order.
        current.insert(0, after);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The lines `stdout` gives, as they come.
fn lines_of(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (send, receive) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if line.map(|line| send.send(line)).is_err() {
                return;
            }
        }
    });
    receive
}
