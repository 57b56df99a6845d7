//! The web console on the admin port (`/ui`): views of the fleet, of one
//! cluster, of one operation, of the members and of the rollouts, kept
//! live by a stream of server-sent events (`/ui/api/events`; the rollout
//! pages poll instead, see `web/app.js`), a rollout's four controls, and
//! the actions on clusters and operations (`actions`).
//!
//! The page, its script and its style are built into the binary
//! ([`assets`]): no CDN, no build step. The script reads JSON under
//! `/ui/api/`, served from this replica's cluster cache and, for what the
//! cache does not hold (operations, tasks, owners, members, rollouts), by
//! the same handlers and proto conversions as the gRPC API, serialized
//! with the proto messages' serde impls.
//!
//! # Guarantees
//! - Every `/ui/api/` answer is checked as the gRPC call it mirrors (the
//!   fleet as ListClusters, a cluster as GetCluster, an operation as
//!   GetOperation, the members as ListMembers, the events as
//!   WatchClusters, the rollouts as ListRollouts, a rollout as
//!   GetRollout, its actions as PauseRollout, ResumeRollout,
//!   ApproveRollout and CancelRollout) against the replica's tokens: no
//!   token or an unknown one gets 401, a role too low 403. The fleet's
//!   owner column is filled only for callers that may call GetOwner, and
//!   a rollout's answer lists only the actions the caller may take (the
//!   page shows only those buttons). Without `--auth-tokens` everything is
//!   open, as the API is.
//! - What the console can change is exactly this: pause, resume, approve
//!   a stage of, or cancel (optionally with its running operations) a
//!   rollout, each by `POST /ui/api/rollouts/<name>/<action>`; pause or
//!   unpause a cluster and suspend or resume its task runs
//!   (`POST /ui/api/clusters/<name>/<action>`, as UpdateCluster); cancel an
//!   operation (`POST /ui/api/operations/<cluster>/<id>/cancel`, as
//!   CancelOperation); and cancel the running operations of the clusters a
//!   label selector picks (`GET /ui/api/bulk/cancel?label=k=v` counts them,
//!   as ListClusters; the `POST` with `{"count": N}`, as CancelOperation,
//!   cancels them only while there are still N, else 409 and nothing is
//!   cancelled). Each is handled by that RPC's own gRPC handler; a
//!   cluster's answer lists only the actions the caller may take.
//!   Everything else it serves only reads.
//! - An action needs `Content-Type: application/json` (else 415, nothing
//!   changed): a cross-site HTML form cannot send that type, and a
//!   cross-site `fetch` with it needs a CORS preflight the console never
//!   grants. Reads are GET only, actions POST only (else 405).
//!
//! # Assumptions
//! - The page keeps its token in `sessionStorage` (gone with the tab) and
//!   sends it as `Authorization: Bearer` on every call, the event stream
//!   included (read with `fetch`, since `EventSource` cannot send
//!   headers). No cookie is ever set or read, so a browser never attaches
//!   a credential to a request another site makes.
//! - Each action is confirmed in the page first, naming what it will do.
//!
//! # Caveats
//! - Served as the rest of the admin port is: over TLS with `--tls-cert`,
//!   otherwise plain HTTP, where a token sent to it can be sniffed off the
//!   network. The page itself sends none over plain HTTP to a host other
//!   than loopback; a replica binds plain HTTP off loopback only with
//!   `--admin-plain-http`.
//! - Without `--auth-tokens` anyone who reaches the admin port can take a
//!   rollout's actions, as anyone who reaches the gRPC port can.
//! - Step timings are the times this replica's feed saw each step begin
//!   (the records keep only the current step), and it looks only while a
//!   console page is open on this replica: an operation that started
//!   before shows only the steps seen since.

mod actions;
mod assets;
mod body;
mod feed;
mod fleet;
mod history;
mod http;
mod rollouts;

pub use feed::{ConsoleFeed, StepSeen};
pub use fleet::{FleetError, FleetPage, FleetQuery, FleetRow};
pub use http::handle;

use crate::api::{AdminService, ClustersService, OperationsService, RolloutsService, TasksService};
use crate::audit::{AuditLog, Outcome, RequestAudit};
use crate::auth::{Authenticator, TokenFile};
use crate::cluster::ClusterCache;
use crate::executor::Executor;
use crate::operation::Operations;
use crate::provider::Providers;
use crate::rollout::RolloutStore;
use std::sync::{Arc, OnceLock};

/// What the console reads, and who may read it.
pub struct Console {
    auth: Authenticator,
    cache: Arc<ClusterCache>,
    operations: Operations,
    feed: Arc<ConsoleFeed>,
    clusters: ClustersService,
    operations_api: OperationsService,
    tasks: TasksService,
    admin: AdminService,
    rollouts: RolloutsService,
    /// Where each action's line goes, as the gRPC API's do.
    audit: Arc<AuditLog>,
    /// The Clusters service with this replica's executor, once its workers
    /// run (a replica without a provider runs no operation): for Recover.
    lifecycle: OnceLock<ClustersService>,
}

impl Console {
    /// A console over the replica's cache and operations, checking
    /// `tokens` (open without them, like the API), its actions audited in
    /// `audit`.
    pub fn new(
        tokens: Option<&TokenFile>,
        cache: Arc<ClusterCache>,
        operations: Operations,
        feed: Arc<ConsoleFeed>,
        audit: Arc<AuditLog>,
    ) -> Self {
        let auth = match tokens {
            Some(tokens) => Authenticator::from_tokens(tokens),
            None => Authenticator::open(),
        };
        Self {
            auth,
            clusters: ClustersService::new(operations.clone(), Arc::clone(&cache), None, None),
            operations_api: OperationsService::new(operations.clone()),
            tasks: TasksService::new(operations.clone()),
            admin: AdminService::new(
                operations.store().clone(),
                operations.keys().clone(),
                None,
                None,
            ),
            rollouts: RolloutsService::new(
                RolloutStore::new(operations.store().clone(), operations.keys().clone()),
                Arc::clone(&cache),
            ),
            cache,
            operations,
            feed,
            audit,
            lifecycle: OnceLock::new(),
        }
    }

    /// Lets the console start operations (Recover) through `executor`.
    pub fn run_operations_with(&self, executor: Arc<Executor>, providers: Arc<Providers>) {
        let service = ClustersService::new(
            self.operations.clone(),
            Arc::clone(&self.cache),
            Some(executor),
            Some(providers),
        );
        let _ = self.lifecycle.set(service);
    }

    /// Who acts and as which RPC, for the handler of an action the caller
    /// was allowed to take to write its line (as the auth layer does for
    /// gRPC calls).
    fn request_audit(&self, rpc: &str, headers: &hyper::HeaderMap) -> RequestAudit {
        let method = http::rpc_path(rpc);
        let caller = self.auth.identify(&method, headers, None).0;
        RequestAudit {
            log: Arc::clone(&self.audit),
            caller,
            method,
        }
    }

    /// Writes the line of an action refused before any handler ran (no
    /// token, a role too low), naming its cluster or rollout.
    fn audit_refusal(
        &self,
        rpc: &str,
        target: (Option<&str>, Option<&str>),
        headers: &hyper::HeaderMap,
        status: &tonic::Status,
    ) {
        let audit = self.request_audit(rpc, headers);
        self.audit.write(&crate::audit::Entry {
            caller: &audit.caller,
            method: &audit.method,
            cluster: target.0,
            rollout: target.1,
            request_id: "",
            outcome: Outcome::refused(status),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::hash_token;
    use crate::cluster::Spec;
    use crate::keys::KeyLayout;
    use crate::metrics::Metrics;
    use crate::store::MemoryStore;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    use hyper::{Request, StatusCode};
    use std::time::{Duration, Instant};
    use tokio::sync::watch;

    /// A console over a memory store whose cache follows it, with a viewer
    /// token `v` and an admin token `a`; the sender stops the cache.
    fn console() -> (Arc<Console>, Operations, watch::Sender<bool>) {
        let store = Arc::new(MemoryStore::new());
        let keys = KeyLayout::new("/t/");
        let metrics = Metrics::new();
        let cache = ClusterCache::new(store.clone(), keys.clone(), Arc::clone(&metrics));
        let (stop, stopped) = watch::channel(false);
        tokio::spawn(Arc::clone(&cache).run(stopped));
        let operations = Operations::new(store, keys, 10, metrics).with_cache(Arc::clone(&cache));
        let mut file = String::new();
        for (name, role, token) in [("dash", "viewer", "v"), ("oncall", "admin", "a")] {
            let digest = hex::encode(hash_token(token));
            file.push_str(&format!(
                "[[token]]\nname = \"{name}\"\nrole = \"{role}\"\nsha256 = \"{digest}\"\n"
            ));
        }
        let tokens = TokenFile::parse(&file).expect("a token file");
        let audit = AuditLog::open(None, Default::default(), "r1").expect("no sink");
        let feed = ConsoleFeed::new();
        let console = Console::new(Some(&tokens), cache, operations.clone(), feed, audit);
        (Arc::new(console), operations, stop)
    }

    /// The status and body of `path` with `token`.
    async fn get(console: &Arc<Console>, path: &str, token: Option<&str>) -> (StatusCode, String) {
        let mut request = Request::builder().uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let (_open, closed) = watch::channel(false);
        let body = Full::new(Bytes::new());
        let answer = handle(Arc::clone(console), request.body(body).unwrap(), closed).await;
        let status = answer.status();
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// The status and body of a POST of `body` as `content_type` to `path`
    /// with `token`.
    async fn post(
        console: &Arc<Console>,
        path: &str,
        token: &str,
        content_type: &str,
        body: &str,
    ) -> (StatusCode, String) {
        let request = Request::post(path)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let (_open, closed) = watch::channel(false);
        let answer = handle(Arc::clone(console), request, closed).await;
        let status = answer.status();
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    async fn create(operations: &Operations, count: usize, start_every: usize) {
        for i in 0..count {
            let spec = Spec {
                version: "1.29.0".into(),
                control_nodes: 1,
                node_offering: "m".into(),
                labels: [("team".to_string(), format!("t{}", i % 10))].into(),
                ..Spec::default()
            };
            let start = i % start_every == 0;
            let name = format!("c{i:05}");
            operations
                .create_cluster(&name, spec, "", start)
                .await
                .expect("create");
        }
    }

    /// Polls the fleet until it shows `count` clusters.
    async fn until_cached(console: &Arc<Console>, count: usize) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = get(console, "/ui/api/fleet", Some("a")).await;
            if status == StatusCode::OK {
                let fleet: serde_json::Value = serde_json::from_str(&body).unwrap();
                if fleet["total"] == count {
                    return fleet;
                }
            }
            assert!(Instant::now() < deadline, "the cache never showed {count}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn the_api_is_checked_as_the_rpcs_it_mirrors() {
        let (console, operations, _stop) = console();
        create(&operations, 3, 2).await;
        let fleet = until_cached(&console, 3).await;
        assert_eq!(fleet["owners_shown"], true, "{fleet}");
        assert_eq!(fleet["counts"]["CLUSTER_STATE_STARTING"], 2, "{fleet}");
        let op = &fleet["clusters"][0]["operation"];
        assert_eq!(op["kind"], "OPERATION_KIND_START", "{fleet}");
        for path in ["/ui/api/fleet", "/ui/api/clusters/c00000", "/ui/api/events"] {
            assert_eq!(
                get(&console, path, None).await.0,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
            let refused = get(&console, path, Some("guess")).await.0;
            assert_eq!(refused, StatusCode::UNAUTHORIZED, "{path}");
        }
        let (status, body) = get(&console, "/ui/api/fleet", Some("v")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\"owners_shown\":false"), "{body}");
        // ListMembers needs admin, as in the role table.
        let members = get(&console, "/ui/api/members", Some("v")).await.0;
        assert_eq!(members, StatusCode::FORBIDDEN);
        let (status, body) = get(&console, "/ui/api/members", Some("a")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = get(&console, "/ui/api/clusters/c00000", Some("v")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let cluster: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(cluster["cluster"]["name"], "c00000");
        assert_eq!(cluster["operations"][0]["kind"], "OPERATION_KIND_START");
        let states: Vec<_> = cluster["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["state"].clone())
            .collect();
        assert_eq!(states, ["CLUSTER_STATE_CREATED", "CLUSTER_STATE_STARTING"]);
        let missing = get(&console, "/ui/api/clusters/nope", Some("v")).await.0;
        assert_eq!(missing, StatusCode::NOT_FOUND);
        let bad = get(&console, "/ui/api/fleet?state=BOGUS", Some("v")).await;
        assert_eq!(bad.0, StatusCode::BAD_REQUEST);
        assert!(bad.1.contains("state"), "{}", bad.1);
        // The page itself holds no data: open.
        let (status, page) = get(&console, "/ui/", None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains("/ui/app.js"));
        assert_eq!(get(&console, "/ui/app.js", None).await.0, StatusCode::OK);
    }

    /// A rollout of the first three clusters, its one stage behind an
    /// approval gate (no controller runs: it stays as created).
    async fn gated_rollout(console: &Arc<Console>, operations: &Operations) {
        create(operations, 3, 1).await;
        until_cached(console, 3).await;
        let spec = drover_proto::v1::RolloutSpec {
            clusters: vec!["c00000".into(), "c00001".into(), "c00002".into()],
            version: "1.30.0".into(),
            stages: vec![drover_proto::v1::RolloutStage {
                name: "all".into(),
                approval_required: true,
                ..Default::default()
            }],
            ..Default::default()
        };
        let request = drover_proto::v1::CreateRolloutRequest {
            name: "r1".into(),
            spec: Some(spec),
        };
        use drover_proto::v1::rollouts_server::Rollouts;
        let created = console
            .rollouts
            .create_rollout(tonic::Request::new(request));
        created.await.expect("the rollout is created");
    }

    #[tokio::test]
    async fn rollout_actions_need_their_role_and_a_json_body() {
        let (console, operations, _stop) = console();
        gated_rollout(&console, &operations).await;
        let store = RolloutStore::new(operations.store().clone(), operations.keys().clone());
        let (status, body) = get(&console, "/ui/api/rollouts", Some("v")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(body.contains("\"name\":\"r1\""), "{body}");
        let (status, body) = get(&console, "/ui/api/rollouts/r1", Some("v")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let shown: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            shown["actions"],
            serde_json::json!([]),
            "a viewer may not act"
        );
        assert_eq!(shown["rollout"]["status"]["stages"][0]["targets"], 3);
        let (_, body) = get(&console, "/ui/api/rollouts/r1", Some("a")).await;
        assert!(body.contains("\"actions\":[\"pause\",\"resume\",\"approve\",\"cancel\"]"));
        let approve = "/ui/api/rollouts/r1/approve";
        let json = "application/json";
        let refused = post(&console, approve, "v", json, r#"{"stage":"all"}"#).await;
        assert_eq!(refused.0, StatusCode::FORBIDDEN, "{}", refused.1);
        let form = "application/x-www-form-urlencoded";
        let refused = post(&console, approve, "a", form, "stage=all").await;
        assert_eq!(
            refused.0,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{}",
            refused.1
        );
        assert_eq!(
            get(&console, approve, Some("a")).await.0,
            StatusCode::METHOD_NOT_ALLOWED
        );
        let unknown = post(&console, approve, "a", json, r#"{"stage":"nope"}"#).await;
        assert_eq!(unknown.0, StatusCode::BAD_REQUEST, "{}", unknown.1);
        let (record, _) = store.record("r1").await.unwrap();
        assert!(
            record.control.approved.is_empty(),
            "refused calls change nothing"
        );
        let (status, body) = post(&console, approve, "a", json, r#"{"stage":"all"}"#).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let cancel = "/ui/api/rollouts/r1/cancel";
        let (status, body) = post(&console, cancel, "a", json, r#"{"cancel_running":true}"#).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (record, _) = store.record("r1").await.unwrap();
        assert_eq!(record.control.approved, ["all"]);
        assert!(record.control.cancel.is_some_and(|c| c.cancel_running));
        let missing = post(&console, "/ui/api/rollouts/nope/pause", "a", json, "").await;
        assert_eq!(missing.0, StatusCode::NOT_FOUND, "{}", missing.1);
    }

    /// The figure in the README: the fleet's first page, its counts over
    /// every cluster, for ten thousand clusters in the cache.
    #[tokio::test]
    async fn the_fleet_of_ten_thousand_answers_quickly() {
        const CLUSTERS: usize = 10_000;
        let (console, operations, _stop) = console();
        create(&operations, CLUSTERS, 100).await;
        until_cached(&console, CLUSTERS).await;
        for path in [
            "/ui/api/fleet",
            "/ui/api/fleet?state=CLUSTER_STATE_STARTING",
            "/ui/api/fleet?label=team%3Dt3&page=5",
        ] {
            let mut fastest = Duration::MAX;
            for _ in 0..5 {
                let started = Instant::now();
                let (status, body) = get(&console, path, Some("a")).await;
                fastest = fastest.min(started.elapsed());
                assert_eq!(status, StatusCode::OK, "{body}");
                let fleet: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(fleet["total"], CLUSTERS);
                assert_eq!(fleet["counts"]["CLUSTER_STATE_STARTING"], CLUSTERS / 100);
                assert!(!fleet["clusters"].as_array().unwrap().is_empty(), "{path}");
            }
            println!("fleet {path} over {CLUSTERS} clusters: {fastest:?}");
            // Generous for an unoptimized build on a busy machine; the
            // figure printed is what the README records.
            assert!(fastest < Duration::from_secs(2), "{path}: {fastest:?}");
        }
    }
}
