//! The etcd [`Store`], over etcd-client.
//!
//! # Caveats
//! - A keep-alive opens a short-lived keep-alive stream per call; Drover
//!   renews each lease every TTL/3, so this costs one stream per second or so.

use super::types::{check_ops, prefix_end};
use super::*;
use etcd_client::{
    Client, Compare as EtcdCompare, CompareOp, ConnectOptions, EventType, GetOptions, KvClient,
    LeaseClient, MaintenanceClient, PutOptions, SortOrder, SortTarget, TxnOp, TxnOpResponse,
    WatchClient, WatchFilterType, WatchOptions,
};
use std::time::Duration;
use tokio::sync::mpsc;

use crate::config::{EtcdTls, EtcdUser};

mod batch;
use batch::Batcher;

/// Keys per range request when reading a large prefix.
const RANGE_PAGE: i64 = 1000;

/// How to reach etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// Deadline of each request.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// TLS (https:// endpoints): the CA and an optional client identity.
    pub tls: Option<EtcdTls>,
    /// An etcd user, when etcd has authentication enabled.
    pub user: Option<EtcdUser>,
    /// Whether small transactions asked for together share a request
    /// (see `batch`); off, each is a request of its own (the benchmark's
    /// raw etcd loop).
    pub group_commit: bool,
}

impl EtcdOptions {
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            tls: None,
            user: None,
            group_commit: true,
        }
    }
}

/// A store backed by an etcd cluster.
///
/// It keeps the four service clients it uses rather than etcd-client's
/// `Client`: every request clones its client, and a `Client` clone copies
/// all eight service clients (a measurable share of a replica's CPU per
/// operation). They share one connection and one auth token.
#[derive(Clone)]
pub struct EtcdStore {
    kv: KvClient,
    watch: WatchClient,
    lease: LeaseClient,
    /// For the server version only (Status).
    maintenance: MaintenanceClient,
    /// Sends small transactions together while one is in flight; `None`
    /// without group commit.
    batcher: Option<Batcher>,
}

impl EtcdStore {
    /// Connects to etcd. The connection is established lazily by etcd-client
    /// and re-established after failures.
    pub async fn connect(options: &EtcdOptions) -> Result<Self> {
        let mut connect = ConnectOptions::new()
            .with_timeout(options.request_timeout)
            .with_connect_timeout(options.connect_timeout)
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member cut off from its peers answers nothing new, yet a
            // watch on it would stay open, silent: with this, etcd refuses
            // requests and ends watches on a member without a leader, and
            // the caller retries (on another endpoint, when it has one).
            .with_require_leader(true);
        if let Some(tls) = &options.tls {
            let mut config = etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(&tls.ca_pem));
            if let Some((cert, key)) = &tls.identity {
                config = config.identity(etcd_client::Identity::from_pem(cert, key.expose()));
            }
            connect = connect.with_tls(config);
        }
        if let Some(user) = &options.user {
            connect = connect.with_user(user.name.clone(), user.password.expose().clone());
        }
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(into_store_error)?;
        Ok(Self {
            kv: client.kv_client(),
            watch: client.watch_client(),
            lease: client.lease_client(),
            maintenance: client.maintenance_client(),
            batcher: options
                .group_commit
                .then(|| Batcher::start(client.kv_client())),
        })
    }

    /// Transactions sent in a request shared with others since the
    /// connection was made (see `batch`).
    pub fn txns_batched(&self) -> u64 {
        self.batcher.as_ref().map_or(0, Batcher::batched)
    }

    /// Batches etcd refused whole (for one member's sake, say an expired
    /// lease) and that were sent again one transaction per request.
    pub fn batches_sent_again(&self) -> u64 {
        self.batcher.as_ref().map_or(0, Batcher::sent_again)
    }
}

/// How a request may be retried after a connection failure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retry {
    /// Only when it never left this process (no connection could be made):
    /// writes, whose outcome is otherwise unknown.
    IfNotSent,
    /// Whenever etcd was unreachable: reads and renewals.
    Idempotent,
}

/// Attempts per request before an unreachable etcd is reported.
const ATTEMPTS: u32 = 5;

/// Whether the request failed before it reached any etcd member. With
/// several endpoints, the balancer may still route a call to a dead member
/// (a killed leader, say); such a call can simply go again.
fn never_sent(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable && status.message().contains("connect error")
        }
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether the member refused the request before proposing it: one cut
/// off from its peers (in the minority of a partition) knows no leader and
/// says so at once (`with_require_leader`). Nothing was applied, so any
/// request, a write included, can go again: the balancer sends it to
/// another member.
fn refused_without_leader(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::Unavailable && status.message().contains(NO_LEADER)
        }
        _ => false,
    }
}

/// How etcd words a request refused by a member that knows no leader.
const NO_LEADER: &str = "no leader";

fn unreachable(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                true
            }
            tonic::Code::Unknown => std::error::Error::source(status).is_some(),
            _ => false,
        },
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

impl EtcdStore {
    /// Watches `prefix` with etcd's event `filters`, delivering events
    /// one by one on a channel.
    async fn watch_filtered(
        &self,
        prefix: &str,
        from_revision: i64,
        filters: Vec<WatchFilterType>,
    ) -> Result<WatchStream> {
        let mut options = WatchOptions::new()
            .with_range(prefix_end(prefix))
            .with_filters(filters);
        if from_revision > 0 {
            options = options.with_start_revision(from_revision);
        }
        let mut stream = call(&self.watch, Retry::Idempotent, |mut client| {
            let (prefix, options) = (prefix.to_string(), options.clone());
            async move { client.watch(prefix, Some(options)).await }
        })
        .await
        .map_err(into_store_error)?;
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = sender.closed() => return,
                    message = stream.message() => message,
                };
                let response = match message {
                    Ok(Some(response)) => response,
                    Ok(None) => return,
                    Err(error) => {
                        let _ = sender.send(Err(into_store_error(error)));
                        return;
                    }
                };
                if response.compact_revision() > 0 {
                    let _ = sender.send(Err(StoreError::Compacted {
                        requested: from_revision,
                        compacted: response.compact_revision(),
                    }));
                    return;
                }
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    let kind = match event.event_type() {
                        EventType::Put => EventKind::Put,
                        EventType::Delete => EventKind::Delete,
                    };
                    if sender
                        .send(Ok(WatchEvent {
                            kind,
                            kv: from_etcd_kv(kv),
                        }))
                        .is_err()
                    {
                        return;
                    }
                }
                if response.canceled() {
                    let _ = sender.send(Err(StoreError::Unavailable(format!(
                        "watch cancelled by etcd: {}",
                        response.cancel_reason()
                    ))));
                    return;
                }
            }
        });
        Ok(WatchStream::new(receiver))
    }
}

/// Runs a request on a clone of `client`, retrying it (with a short
/// backoff) as `retry` allows.
async fn call<C, T, F, Fut>(
    client: &C,
    retry: Retry,
    mut request: F,
) -> std::result::Result<T, etcd_client::Error>
where
    C: Clone,
    F: FnMut(C) -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    let mut delay = Duration::from_millis(20);
    let mut attempt = 1;
    loop {
        match request(client.clone()).await {
            Err(error)
                if attempt < ATTEMPTS
                    && (never_sent(&error)
                        || refused_without_leader(&error)
                        || (retry == Retry::Idempotent && unreachable(&error))) =>
            {
                attempt += 1;
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
}

/// How etcd words a write refused under its NOSPACE alarm.
const NO_SPACE: &str = "database space exceeded";

fn into_store_error(error: etcd_client::Error) -> StoreError {
    use etcd_client::Error;
    match error {
        Error::GRpcStatus(status) => {
            let message = status.message().to_string();
            match status.code() {
                tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled => StoreError::Unavailable(message),
                // A connection that broke mid-request surfaces as Unknown
                // with the transport error as its source.
                tonic::Code::Unknown if std::error::Error::source(&status).is_some() => {
                    StoreError::Unavailable(message)
                }
                // Refused before applying (the NOSPACE alarm is raised):
                // nothing of the request was written.
                tonic::Code::ResourceExhausted if message.contains(NO_SPACE) => {
                    StoreError::NoSpace(message)
                }
                _ if message.contains("required revision has been compacted") => {
                    StoreError::Compacted {
                        requested: 0,
                        compacted: 0,
                    }
                }
                _ if message.contains("lease not found") => StoreError::LeaseNotFound(0),
                _ => StoreError::Other(message),
            }
        }
        Error::TransportError(e) => StoreError::Unavailable(e.to_string()),
        Error::LeaseKeepAliveError(message) if message.contains("lease not found") => {
            StoreError::LeaseNotFound(0)
        }
        Error::IoError(e) => StoreError::Unavailable(e.to_string()),
        other => StoreError::Other(other.to_string()),
    }
}

fn from_etcd_kv(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

fn to_etcd_compare(compare: &Compare) -> EtcdCompare {
    let op = match compare.op {
        CmpOp::Equal => CompareOp::Equal,
        CmpOp::NotEqual => CompareOp::NotEqual,
        CmpOp::Greater => CompareOp::Greater,
        CmpOp::Less => CompareOp::Less,
    };
    let key = compare.key.as_str();
    match &compare.target {
        Target::Version(v) => EtcdCompare::version(key, op, *v),
        Target::CreateRevision(v) => EtcdCompare::create_revision(key, op, *v),
        Target::ModRevision(v) => EtcdCompare::mod_revision(key, op, *v),
        Target::Value(v) => EtcdCompare::value(key, op, v.clone()),
        Target::Lease(v) => EtcdCompare::lease(key, op, *v),
    }
}

fn to_etcd_op(op: &Op) -> TxnOp {
    match op {
        Op::Put { key, value, lease } => {
            let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            TxnOp::put(key.as_str(), value.clone(), options)
        }
        Op::Get { key } => TxnOp::get(key.as_str(), None),
        Op::Delete { key } => TxnOp::delete(key.as_str(), None),
        Op::DeletePrefix { prefix } => TxnOp::delete(
            prefix.as_str(),
            Some(etcd_client::DeleteOptions::new().with_range(prefix_end(prefix))),
        ),
    }
}

fn from_etcd_op_response(response: &TxnOpResponse) -> OpResult {
    match response {
        TxnOpResponse::Put(_) => OpResult::Put,
        TxnOpResponse::Get(get) => OpResult::Get(get.kvs().first().map(from_etcd_kv)),
        TxnOpResponse::Delete(delete) => OpResult::Delete {
            deleted: delete.deleted(),
        },
        // Drover never nests transactions.
        TxnOpResponse::Txn(_) => OpResult::Put,
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn get(&self, key: &str) -> Result<GetResult> {
        let response = call(&self.kv, Retry::Idempotent, |mut client| {
            let key = key.to_string();
            async move { client.get(key, None).await }
        })
        .await
        .map_err(into_store_error)?;
        Ok(GetResult {
            kvs: response.kvs().iter().map(from_etcd_kv).collect(),
            revision: header_revision(response.header()),
            more: response.more(),
            count: usize::try_from(response.count()).unwrap_or(0),
        })
    }

    async fn range(&self, request: RangeRequest) -> Result<GetResult> {
        let mut start = request
            .start
            .clone()
            .filter(|start| start.as_str() > request.prefix.as_str())
            .unwrap_or_else(|| request.prefix.clone())
            .into_bytes();
        let wanted = usize::try_from(request.limit).unwrap_or(0);
        let mut result = GetResult::default();
        // Large ranges are read in pages at one revision: one response must
        // stay under the gRPC message limit, and the pages must agree.
        loop {
            let page = match wanted {
                0 => RANGE_PAGE,
                n => (n - result.kvs.len()).min(RANGE_PAGE as usize) as i64,
            };
            let mut options = GetOptions::new()
                .with_range(prefix_end(&request.prefix))
                .with_limit(page)
                .with_sort(SortTarget::Key, SortOrder::Ascend);
            if result.revision > 0 {
                options = options.with_revision(result.revision);
            }
            let response = call(&self.kv, Retry::Idempotent, |mut client| {
                let (start, options) = (start.clone(), options.clone());
                async move { client.get(start, Some(options)).await }
            })
            .await
            .map_err(into_store_error)?;
            if result.revision == 0 {
                // The first page counts the whole range; later pages start
                // further in.
                result.revision = header_revision(response.header());
                result.count = usize::try_from(response.count()).unwrap_or(0);
            }
            result.kvs.extend(response.kvs().iter().map(from_etcd_kv));
            let full = wanted > 0 && result.kvs.len() >= wanted;
            if !response.more() || full {
                result.more = response.more();
                return Ok(result);
            }
            let Some(last) = response.kvs().last() else {
                return Ok(result);
            };
            start = last.key().to_vec();
            start.push(0);
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        check_ops(&txn.success)?;
        check_ops(&txn.failure)?;
        match &self.batcher {
            Some(batcher) if Batcher::takes(&txn) => batcher.txn(txn).await,
            _ => send_txn(&self.kv, &txn).await,
        }
    }

    async fn grant_lease(&self, ttl_seconds: i64) -> Result<LeaseId> {
        let response = call(&self.lease, Retry::IfNotSent, |mut client| async move {
            client.grant(ttl_seconds, None).await
        })
        .await
        .map_err(into_store_error)?;
        Ok(response.id())
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<i64> {
        let not_found = |error| match into_store_error(error) {
            StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease),
            other => other,
        };
        let response = call(&self.lease, Retry::Idempotent, |mut client| async move {
            let (mut keeper, mut responses) = client.keep_alive(lease).await?;
            keeper.keep_alive().await?;
            responses.message().await
        })
        .await
        .map_err(not_found)?;
        match response {
            Some(response) if response.ttl() > 0 => Ok(response.ttl()),
            Some(_) => Err(StoreError::LeaseNotFound(lease)),
            None => Err(StoreError::Unavailable(
                "keep-alive stream closed".to_string(),
            )),
        }
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        call(&self.lease, Retry::IfNotSent, |mut client| async move {
            client.revoke(lease).await
        })
        .await
        .map_err(|e| match into_store_error(e) {
            StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease),
            other => other,
        })?;
        Ok(())
    }

    async fn lease_time_to_live(&self, lease: LeaseId) -> Result<Option<i64>> {
        let response = call(&self.lease, Retry::Idempotent, |mut client| async move {
            client.time_to_live(lease, None).await
        })
        .await
        .map_err(into_store_error)?;
        // -1: expired or unknown; 0: alive for under a second more.
        Ok((response.ttl() >= 0).then_some(response.ttl()))
    }

    async fn watch(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        self.watch_filtered(prefix, from_revision, Vec::new()).await
    }

    async fn watch_puts(&self, prefix: &str, from_revision: i64) -> Result<WatchStream> {
        self.watch_filtered(prefix, from_revision, vec![WatchFilterType::NoDelete])
            .await
    }

    async fn server_version(&self) -> Result<Option<String>> {
        let status = call(
            &self.maintenance,
            Retry::Idempotent,
            |mut client| async move { client.status().await },
        )
        .await
        .map_err(into_store_error)?;
        Ok(Some(status.version().to_string()))
    }

    async fn raft_progress(&self) -> Result<Option<RaftProgress>> {
        let status = call(
            &self.maintenance,
            Retry::Idempotent,
            |mut client| async move { client.status().await },
        )
        .await
        .map_err(into_store_error)?;
        Ok(Some(RaftProgress {
            raft_index: status.raft_index(),
            revision: header_revision(status.header()),
        }))
    }

    async fn compact(&self, revision: i64) -> Result<()> {
        call(&self.kv, Retry::IfNotSent, |mut client| async move {
            client.compact(revision, None).await
        })
        .await
        .map_err(|e| match into_store_error(e) {
            StoreError::Compacted { .. } => StoreError::Compacted {
                requested: revision,
                compacted: revision,
            },
            other => other,
        })?;
        Ok(())
    }
}

/// `txn` as etcd-client's request.
fn to_etcd_txn(txn: &Txn) -> etcd_client::Txn {
    etcd_client::Txn::new()
        .when(txn.compares.iter().map(to_etcd_compare).collect::<Vec<_>>())
        .and_then(txn.success.iter().map(to_etcd_op).collect::<Vec<_>>())
        .or_else(txn.failure.iter().map(to_etcd_op).collect::<Vec<_>>())
}

/// Sends `txn` as a request of its own.
async fn send_txn(kv: &KvClient, txn: &Txn) -> Result<TxnResult> {
    // Built once for the first attempt and again only for a retry, so the
    // values are copied once.
    let mut first = Some(to_etcd_txn(txn));
    let response = call(kv, Retry::IfNotSent, |mut client| {
        let request = first.take().unwrap_or_else(|| to_etcd_txn(txn));
        async move { client.txn(request).await }
    })
    .await
    .map_err(|e| match into_store_error(e) {
        StoreError::LeaseNotFound(_) => StoreError::LeaseNotFound(lease_of(txn)),
        other => other,
    })?;
    Ok(txn_result(&response, header_revision(response.header())))
}

/// A transaction's outcome from etcd's answer to it (a request's, or a
/// nested transaction's in a batch), at `revision`.
fn txn_result(response: &etcd_client::TxnResponse, revision: i64) -> TxnResult {
    TxnResult {
        succeeded: response.succeeded(),
        revision,
        results: response
            .op_responses()
            .iter()
            .map(from_etcd_op_response)
            .collect(),
    }
}

/// The lease a failed transaction referred to, for the error message.
fn lease_of(txn: &Txn) -> LeaseId {
    txn.success
        .iter()
        .chain(&txn.failure)
        .find_map(|op| match op {
            Op::Put { lease, .. } if *lease != 0 => Some(*lease),
            _ => None,
        })
        .unwrap_or(0)
}
