//! A bounded load of stops and starts over clusters that already run, each
//! submitted under its own request id and waited for, with what it
//! measured (ops/s, submit and end-to-end latency) and the check that each
//! request id was accepted once.

use drover_client::v1::{self, OperationState as O};
use drover_client::Client;
use std::time::{Duration, Instant};

/// How long one submit attempt may go unanswered before the client asks
/// again (under the same request id), and one operation may take.
const ATTEMPT_BOUND: Duration = Duration::from_secs(10);
const OPERATION_BOUND: Duration = Duration::from_secs(60);

/// What one phase of load measured.
#[derive(Default)]
pub struct Figures {
    pub wall: Duration,
    /// Submit (accepted) and end-to-end (submit to end) latency, per
    /// operation.
    pub submits: Vec<Duration>,
    pub ends: Vec<Duration>,
    /// Submit attempts the client made again (UNAVAILABLE, no answer).
    pub retried: u32,
    /// Every operation accepted: (request id, operation id).
    pub accepted: Vec<(String, String)>,
}

impl Figures {
    /// Operations ended per second of the phase.
    pub fn rate(&self) -> f64 {
        self.ends.len() as f64 / self.wall.as_secs_f64()
    }

    pub fn line(&self, phase: &str) -> String {
        let ms = |samples: &[Duration], p| percentile(samples, p).as_millis();
        format!(
            "{phase}: {} operations in {:.1} s, {:.2} ops/s; submit p50 {} ms p99 {} ms; \
             end-to-end p50 {} ms p99 {} ms; {} submits retried",
            self.ends.len(),
            self.wall.as_secs_f64(),
            self.rate(),
            ms(&self.submits, 50),
            ms(&self.submits, 99),
            ms(&self.ends, 50),
            ms(&self.ends, 99),
            self.retried
        )
    }
}

/// The nearest-rank `p`th percentile (with a dozen samples, p99 is the
/// slowest).
pub fn percentile(samples: &[Duration], p: usize) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted.get(rank - 1).copied().unwrap_or_default()
}

/// Submits one stop or start under `request_id`, sent again while the
/// answer is UNAVAILABLE or does not come within [`ATTEMPT_BOUND`]; the
/// operation and how many attempts were made again.
pub async fn submit(
    client: &Client,
    name: &str,
    stop: bool,
    request_id: &str,
) -> (v1::Operation, u32) {
    let attempts = std::sync::atomic::AtomicU32::new(0);
    let op = client
        .retrying_unavailable(|mut client| {
            attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (name, request_id) = (name.to_string(), request_id.to_string());
            async move {
                let answer = if stop {
                    let request = v1::StopClusterRequest {
                        name,
                        request_id,
                        ..Default::default()
                    };
                    tokio::time::timeout(ATTEMPT_BOUND, client.clusters().stop_cluster(request))
                        .await
                } else {
                    let request = v1::StartClusterRequest {
                        name,
                        request_id,
                        ..Default::default()
                    };
                    tokio::time::timeout(ATTEMPT_BOUND, client.clusters().start_cluster(request))
                        .await
                };
                let silent =
                    || tonic::Status::unavailable(format!("no answer in {ATTEMPT_BOUND:?}"));
                Ok(answer.map_err(|_| silent())??.into_inner())
            }
        })
        .await
        .unwrap_or_else(|error| panic!("{request_id}: {error}"));
    (op, attempts.into_inner() - 1)
}

/// One phase: on each of `clusters` (running), through `clients` in turn,
/// stops and starts it `per_cluster` times, each waited for; the clusters
/// go concurrently. Every operation must succeed: the callers' faults may
/// delay an operation (or hand it to another owner) but never give it a
/// reason to fail.
pub async fn stops_and_starts(
    clients: &[Client],
    clusters: &[String],
    per_cluster: usize,
    phase: &str,
) -> Figures {
    let started = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for (c, name) in clusters.iter().enumerate() {
        let mut client = clients[c % clients.len()].clone();
        let (name, phase) = (name.clone(), phase.to_string());
        runs.spawn(async move {
            let mut figures = Figures::default();
            for n in 0..per_cluster {
                let request_id = format!("{phase}-{name}-{n}");
                let begun = Instant::now();
                let (op, retried) = submit(&client, &name, n % 2 == 0, &request_id).await;
                figures.submits.push(begun.elapsed());
                figures.retried += retried;
                let done = client
                    .wait_operation(&op, OPERATION_BOUND)
                    .await
                    .unwrap_or_else(|error| panic!("{request_id}: {error}"));
                assert_eq!(done.state, O::Succeeded as i32, "{request_id}: {done:?}");
                figures.ends.push(begun.elapsed());
                figures.accepted.push((request_id, op.id));
            }
            figures
        });
    }
    let mut all = Figures::default();
    while let Some(run) = runs.join_next().await {
        let run = run.expect("a load run");
        all.submits.extend(run.submits);
        all.ends.extend(run.ends);
        all.retried += run.retried;
        all.accepted.extend(run.accepted);
    }
    all.wall = started.elapsed();
    all
}

/// Each of `accepted` (request id, operation id) names exactly one of
/// `operations`, the one accepted: a submit asked again was not accepted
/// twice.
pub fn assert_accepted_once(operations: &[v1::Operation], accepted: &[&(String, String)]) {
    for (request_id, id) in accepted {
        let named: Vec<_> = operations
            .iter()
            .filter(|op| &op.request_id == request_id)
            .collect();
        assert_eq!(named.len(), 1, "{request_id}: {named:?}");
        assert_eq!(&named[0].id, id, "{request_id}");
    }
}

/// Operations resumed by a new owner: runs beyond each one's first.
pub fn resumed(operations: &[v1::Operation]) -> usize {
    operations
        .iter()
        .map(|op| op.runs.len().saturating_sub(1))
        .sum()
}
