//! `droverctl cluster ...` and `droverctl watch`: clusters read, edited and
//! watched; the lifecycle commands, each a request that starts an
//! operation, sent and followed by one helper ([`Lifecycle::run`]); how
//! clusters are printed.

use crate::output::{age, label_pairs, Listing, Output, Table};
use crate::policy::{parse_health, parse_upgrade_policy};
use crate::{op, send};
use clap::Subcommand;
use drover_client::{v1, Client, ClientError};

#[derive(Subcommand)]
pub enum ClusterCommand {
    // Create and Update are boxed: with their policies they are far larger
    // than the other commands.
    /// Create a cluster.
    Create(Box<CreateArgs>),
    /// Start a cluster.
    Start {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Stop a cluster.
    Stop {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Change worker count and/or node offering.
    Scale {
        #[command(flatten)]
        args: ScaleArgs,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Rolling upgrade to a version (a semantic version, e.g. 1.30.0).
    Upgrade {
        #[command(flatten)]
        args: UpgradeArgs,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Add worker nodes.
    AddNodes {
        #[command(flatten)]
        args: AddNodesArgs,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Remove worker nodes by id.
    RemoveNodes {
        #[command(flatten)]
        args: RemoveNodesArgs,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Recover a cluster in Alert.
    Recover {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Replace a cluster's labels, maintenance window, health policy and/or
    /// upgrade policy (bumps its generation): give the new labels (--label)
    /// or --clear-labels to remove them all; the new window (--window,
    /// --timezone) or --no-window to clear it; the new policy (--health,
    /// --upgrade-policy) or --no-health, --no-upgrade-policy to go back to
    /// the defaults.
    Update(Box<UpdateArgs>),
    /// Pause a cluster: Drover starts nothing on its own for it (no
    /// automatic remediation, task run or rollout step) until unpaused; an
    /// operator's own requests still run.
    Pause { name: String },
    /// Lift a pause: remediation, task runs and rollout steps go on.
    Unpause { name: String },
    /// Destroy a cluster.
    Delete {
        name: String,
        #[command(flatten)]
        lifecycle: Lifecycle,
    },
    /// Show one cluster.
    Get { name: String },
    /// Everything about one cluster: spec, status, nodes, operations and
    /// their steps, tasks, and its recent state changes.
    Describe { name: String },
    /// List clusters (Destroyed ones only with --all or --state).
    List(ListArgs),
}

#[derive(clap::Args)]
pub struct CreateArgs {
    name: String,
    #[arg(long)]
    version: String,
    #[arg(long, default_value_t = 1)]
    control_nodes: u32,
    #[arg(long, default_value_t = 0)]
    workers: u32,
    #[arg(long, default_value = "medium")]
    offering: String,
    /// The provider that builds it (`droverctl provider list`); fixed at
    /// create [default: the replicas' default provider].
    #[arg(long, default_value = "")]
    provider: String,
    /// A label, key=value; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Leave the cluster Created instead of starting it.
    #[arg(long)]
    create_only: bool,
    #[command(flatten)]
    policies: PolicyArgs,
    #[command(flatten)]
    lifecycle: Lifecycle,
}

/// `--health` and `--upgrade-policy`, of `cluster create` and `cluster
/// update`: each a whole policy, read before anything is sent (an unknown
/// key or a bad value is a usage error naming it).
#[derive(clap::Args)]
pub struct PolicyArgs {
    /// The health policy, KEY=VALUE[,KEY=VALUE...], defaults in brackets:
    /// unhealthy_timeout_seconds [300], startup_timeout_seconds [600],
    /// max_unhealthy (a count or a percentage of the nodes, e.g. 2 or 40%
    /// [40%]), max_in_flight [1], max_retry [3; 0: no remediation],
    /// retry_period_seconds [300], min_healthy_period_seconds [600],
    /// remediation (repair or replace [repair]). It replaces the whole
    /// policy: a key not given takes the server's default, not its value
    /// before.
    #[arg(long, value_name = "KEY=VALUE,...", value_parser = parse_health)]
    health: Option<v1::HealthPolicy>,
    /// The upgrade policy, KEY=VALUE[,KEY=VALUE...], defaults in brackets:
    /// max_unavailable (workers upgraded at once [1]), max_surge (workers
    /// added for the upgrade [0]), step_retries (times a failed node call
    /// is sent again [0]), step_timeout_seconds (how long one node call may
    /// take [no limit]). It replaces the whole policy: a key not given
    /// takes the server's default, not its value before.
    #[arg(long, value_name = "KEY=VALUE,...", value_parser = parse_upgrade_policy)]
    upgrade_policy: Option<v1::UpgradePolicy>,
}

/// `cluster scale`'s own arguments, the lifecycle flags apart. Like the
/// next three, they build their request themselves, so that [`run`] reads
/// one short arm per command.
#[derive(clap::Args)]
pub struct ScaleArgs {
    name: String,
    #[arg(long)]
    workers: Option<u32>,
    #[arg(long)]
    offering: Option<String>,
}

impl ScaleArgs {
    fn request(self, request_id: String) -> v1::ScaleClusterRequest {
        v1::ScaleClusterRequest {
            name: self.name,
            worker_nodes: self.workers,
            node_offering: self.offering,
            autoscaling: None,
            request_id,
            ..Default::default()
        }
    }
}

/// `cluster upgrade`'s own arguments, the lifecycle flags apart.
#[derive(clap::Args)]
pub struct UpgradeArgs {
    name: String,
    #[arg(long)]
    version: String,
    /// Allow a version lower than the cluster's (refused otherwise).
    #[arg(long)]
    allow_downgrade: bool,
}

impl UpgradeArgs {
    fn request(self, request_id: String) -> v1::UpgradeClusterRequest {
        v1::UpgradeClusterRequest {
            name: self.name,
            version: self.version,
            request_id,
            allow_downgrade: self.allow_downgrade,
            ..Default::default()
        }
    }
}

/// `cluster add-nodes`'s own arguments, the lifecycle flags apart.
#[derive(clap::Args)]
pub struct AddNodesArgs {
    name: String,
    #[arg(long)]
    count: u32,
}

impl AddNodesArgs {
    fn request(self, request_id: String) -> v1::AddNodesRequest {
        v1::AddNodesRequest {
            name: self.name,
            count: self.count,
            request_id,
            ..Default::default()
        }
    }
}

/// `cluster remove-nodes`'s own arguments, the lifecycle flags apart.
#[derive(clap::Args)]
pub struct RemoveNodesArgs {
    name: String,
    #[arg(required = true)]
    node_ids: Vec<String>,
}

impl RemoveNodesArgs {
    fn request(self, request_id: String) -> v1::RemoveNodesRequest {
        v1::RemoveNodesRequest {
            name: self.name,
            node_ids: self.node_ids,
            request_id,
            ..Default::default()
        }
    }
}

/// An update names what it changes: with no flag it would replace the
/// labels with none, wiping them by accident.
#[derive(clap::Args)]
#[command(group(
    clap::ArgGroup::new("change")
        .required(true)
        .multiple(true)
        .args([
            "labels",
            "clear_labels",
            "window",
            "no_window",
            "health",
            "no_health",
            "upgrade_policy",
            "no_upgrade_policy",
        ])
))]
pub struct UpdateArgs {
    name: String,
    /// A label, key=value; repeatable. The labels given replace all.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Remove every label.
    #[arg(long, conflicts_with = "labels")]
    clear_labels: bool,
    /// A maintenance window bound, [WEEKDAY-]HH:MM, read in pairs (start,
    /// end): `--window Sat-22:00 --window Sun-06:00` or
    /// `--window 01:00,05:00`. Drover starts task runs, rollout steps and
    /// remediation only inside the window; the bounds given replace the
    /// old window.
    #[arg(long = "window", value_name = "BOUND", value_delimiter = ',')]
    window: Vec<String>,
    /// The IANA time zone of the window's bounds [default: UTC].
    #[arg(long, value_name = "ZONE", requires = "window")]
    timezone: Option<String>,
    /// Remove the maintenance window: always open.
    #[arg(long, conflicts_with_all = ["window", "timezone"])]
    no_window: bool,
    #[command(flatten)]
    policies: PolicyArgs,
    /// Go back to the default health policy (every key at its default).
    #[arg(long, conflicts_with = "health")]
    no_health: bool,
    /// Go back to the default upgrade policy (every key at its default).
    #[arg(long, conflicts_with = "upgrade_policy")]
    no_upgrade_policy: bool,
    /// Apply only if the cluster is still at this generation.
    #[arg(long, default_value_t = 0)]
    expected_generation: i64,
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Only clusters carrying these labels ("k=v,k2=v2").
    #[arg(long, short = 'l', visible_alias = "label", default_value = "")]
    selector: String,
    /// Only clusters in this state (e.g. running, alert, destroyed).
    #[arg(long, value_parser = parse_state)]
    state: Option<v1::ClusterState>,
    /// Destroyed clusters too.
    #[arg(long, short = 'A')]
    all: bool,
    /// After the list, stream changes (as `droverctl watch`).
    #[arg(long, short = 'w')]
    watch: bool,
    /// Clusters per page (1..=1000), each page printed as it arrives: -o
    /// json and -o yaml still print one array, a table its header once.
    #[arg(long, default_value_t = 100)]
    page_size: u32,
    /// Read the replica's watch cache (faster, may lag by milliseconds)
    /// instead of etcd.
    #[arg(long)]
    cached: bool,
}

fn parse_label(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not key=value"))
}

/// Flags shared by every lifecycle command.
#[derive(clap::Args)]
pub struct Lifecycle {
    /// Wait for the operation to end, showing its steps.
    #[arg(long)]
    wait: bool,
    /// Idempotency key [default: a new one per command]: the same key
    /// again returns the operation it started instead of a new one.
    #[arg(long, default_value = "")]
    request_id: String,
}

impl Lifecycle {
    /// The key given, or a new one: the request is sent again while no
    /// replica answers, and the key makes sure it starts one operation.
    fn request_id(&self) -> String {
        if self.request_id.is_empty() {
            format!("droverctl-{}", uuid::Uuid::new_v4())
        } else {
            self.request_id.clone()
        }
    }

    /// Sends the request `request` builds around this command's request id,
    /// then prints the operation it started, or follows it to its end with
    /// `--wait`.
    async fn run<R: StartsOperation>(
        self,
        client: &mut Client,
        output: Output,
        request: impl FnOnce(String) -> R,
    ) -> Result<(), ClientError> {
        let request = request(self.request_id());
        let op = send(client, request, |client, request: R| request.call(client)).await?;
        op::follow(client, output, op, self.wait).await
    }
}

/// A lifecycle request, and the Clusters RPC that sends it and answers with
/// the operation it started.
trait StartsOperation: Clone {
    async fn call(self, client: Client) -> Result<v1::Operation, ClientError>;
}

impl StartsOperation for v1::StartClusterRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().start_cluster(self).await?.into_inner())
    }
}

impl StartsOperation for v1::StopClusterRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().stop_cluster(self).await?.into_inner())
    }
}

impl StartsOperation for v1::ScaleClusterRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().scale_cluster(self).await?.into_inner())
    }
}

impl StartsOperation for v1::UpgradeClusterRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().upgrade_cluster(self).await?.into_inner())
    }
}

impl StartsOperation for v1::AddNodesRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().add_nodes(self).await?.into_inner())
    }
}

impl StartsOperation for v1::RemoveNodesRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().remove_nodes(self).await?.into_inner())
    }
}

impl StartsOperation for v1::RecoverClusterRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().recover_cluster(self).await?.into_inner())
    }
}

impl StartsOperation for v1::DeleteClusterRequest {
    async fn call(self, mut client: Client) -> Result<v1::Operation, ClientError> {
        Ok(client.clusters().delete_cluster(self).await?.into_inner())
    }
}

pub async fn run(
    client: &mut Client,
    output: Output,
    command: ClusterCommand,
) -> Result<(), ClientError> {
    match command {
        ClusterCommand::Create(args) => create(client, output, *args).await,
        ClusterCommand::Start { name, lifecycle } => {
            let request = |request_id| v1::StartClusterRequest {
                name,
                request_id,
                ..Default::default()
            };
            lifecycle.run(client, output, request).await
        }
        ClusterCommand::Stop { name, lifecycle } => {
            let request = |request_id| v1::StopClusterRequest {
                name,
                request_id,
                ..Default::default()
            };
            lifecycle.run(client, output, request).await
        }
        ClusterCommand::Scale { args, lifecycle } => {
            lifecycle.run(client, output, |id| args.request(id)).await
        }
        ClusterCommand::Upgrade { args, lifecycle } => {
            lifecycle.run(client, output, |id| args.request(id)).await
        }
        ClusterCommand::AddNodes { args, lifecycle } => {
            lifecycle.run(client, output, |id| args.request(id)).await
        }
        ClusterCommand::RemoveNodes { args, lifecycle } => {
            lifecycle.run(client, output, |id| args.request(id)).await
        }
        ClusterCommand::Recover { name, lifecycle } => {
            let request = |request_id| v1::RecoverClusterRequest {
                name,
                request_id,
                ..Default::default()
            };
            lifecycle.run(client, output, request).await
        }
        ClusterCommand::Update(args) => update(client, output, *args).await,
        ClusterCommand::Pause { name } => set_paused(client, output, name, true).await,
        ClusterCommand::Unpause { name } => set_paused(client, output, name, false).await,
        ClusterCommand::Delete { name, lifecycle } => {
            let request = |request_id| v1::DeleteClusterRequest {
                name,
                request_id,
                ..Default::default()
            };
            lifecycle.run(client, output, request).await
        }
        ClusterCommand::Get { name } => get(client, output, name).await,
        ClusterCommand::Describe { name } => crate::describe::cluster(client, output, name).await,
        ClusterCommand::List(args) => list(client, output, args).await,
    }
}

/// `cluster create`: like the other lifecycle commands, but the answer is
/// the cluster with its operation, or only the cluster with `--create-only`.
async fn create(client: &mut Client, output: Output, args: CreateArgs) -> Result<(), ClientError> {
    let CreateArgs {
        name,
        version,
        control_nodes,
        workers,
        offering,
        provider,
        labels,
        create_only,
        policies,
        lifecycle,
    } = args;
    let request = v1::CreateClusterRequest {
        name,
        spec: Some(v1::ClusterSpec {
            version,
            control_nodes,
            worker_nodes: workers,
            node_offering: offering,
            labels: labels.into_iter().collect(),
            provider,
            health: policies.health,
            upgrade_policy: policies.upgrade_policy,
            ..Default::default()
        }),
        create_only,
        request_id: lifecycle.request_id(),
    };
    let response = send(client, request, |mut c, r| async move {
        c.create_cluster(r).await
    })
    .await?;
    match response.operation {
        Some(op) => op::follow(client, output, op, lifecycle.wait).await?,
        None => {
            if let Some(cluster) = response.cluster {
                print_cluster(output, cluster);
            }
        }
    }
    Ok(())
}

async fn update(client: &mut Client, output: Output, args: UpdateArgs) -> Result<(), ClientError> {
    // `clear_labels` is the same request as no labels, `no_window` as no
    // window, `no_health` as an empty health policy (every field at its
    // default), `no_upgrade_policy` likewise: the flags only say that none
    // is what is meant.
    let UpdateArgs {
        name,
        labels,
        clear_labels,
        window,
        timezone,
        no_window,
        policies: PolicyArgs {
            health,
            upgrade_policy,
        },
        no_health,
        no_upgrade_policy,
        expected_generation,
    } = args;
    let update_labels = clear_labels || !labels.is_empty();
    let update_maintenance = no_window || !window.is_empty();
    let update_health = no_health || health.is_some();
    let update_upgrade_policy = no_upgrade_policy || upgrade_policy.is_some();
    let maintenance = v1::MaintenanceWindow {
        window: window.iter().map(|b| b.trim().to_string()).collect(),
        timezone: timezone.unwrap_or_default(),
    };
    let request = v1::UpdateClusterRequest {
        name,
        labels: labels.into_iter().collect(),
        update_labels,
        maintenance: update_maintenance.then_some(maintenance),
        update_maintenance,
        health: update_health.then(|| health.unwrap_or_default()),
        update_health,
        upgrade_policy: update_upgrade_policy.then(|| upgrade_policy.unwrap_or_default()),
        update_upgrade_policy,
        expected_generation,
        ..Default::default()
    };
    let cluster = client
        .clusters()
        .update_cluster(request)
        .await?
        .into_inner();
    print_cluster(output, cluster);
    Ok(())
}

/// `cluster pause` and `cluster unpause`.
async fn set_paused(
    client: &mut Client,
    output: Output,
    name: String,
    paused: bool,
) -> Result<(), ClientError> {
    let request = v1::UpdateClusterRequest {
        name,
        paused: Some(paused),
        ..Default::default()
    };
    let cluster = client.clusters().update_cluster(request).await?;
    print_cluster(output, cluster.into_inner());
    Ok(())
}

async fn get(client: &mut Client, output: Output, name: String) -> Result<(), ClientError> {
    let name = name.as_str();
    let cluster = client
        .retrying_unavailable(|mut c| async move { c.get_cluster(name).await })
        .await?;
    print_cluster(output, cluster);
    Ok(())
}

/// A state as typed (`running`, `Running`, `CLUSTER_STATE_RUNNING`).
fn parse_state(text: &str) -> Result<v1::ClusterState, String> {
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("CLUSTER_STATE_").unwrap_or(&upper);
    v1::ClusterState::from_str_name(&format!("CLUSTER_STATE_{name}"))
        .filter(|s| *s != v1::ClusterState::Unspecified)
        .ok_or_else(|| format!("{text:?} is not a cluster state"))
}

/// `cluster list`: every cluster the selector matches, each page printed as
/// it arrives; with `--watch`, then every change after the listing.
async fn list(client: &mut Client, output: Output, args: ListArgs) -> Result<(), ClientError> {
    let mut listing = ClusterListing::new(output);
    let revision = for_each_page(client, &args, |page| listing.page(&page)).await?;
    listing.end();
    if args.watch {
        stream_changes(client, output, String::new(), revision + 1).await?;
    }
    Ok(())
}

/// Reads the clusters `args` select page by page, handing each page to
/// `each` as it arrives, so that only one page is held however large the
/// fleet; returns the store revision the first page was read at.
async fn for_each_page(
    client: &mut Client,
    args: &ListArgs,
    mut each: impl FnMut(Vec<v1::Cluster>),
) -> Result<i64, ClientError> {
    let mut page_token = String::new();
    let mut revision = None;
    loop {
        let request = v1::ListClustersRequest {
            page_size: args.page_size,
            page_token,
            label_selector: args.selector.clone(),
            linearizable: !args.cached,
            state: args.state.map_or(0, |s| s as i32),
        };
        let mut page = send(client, request, |mut c, r| async move {
            c.list_clusters(r).await
        })
        .await?;
        revision.get_or_insert(page.revision);
        // Destroyed clusters stay listed by the API (their record is
        // history); a person asking for "the clusters" means the ones that
        // exist.
        if !args.all && args.state.is_none() {
            page.clusters.retain(|c| state_name(c) != "DESTROYED");
        }
        each(page.clusters);
        if page.next_page_token.is_empty() {
            return Ok(revision.unwrap_or_default());
        }
        page_token = page.next_page_token;
    }
}

/// `droverctl watch`: the current clusters, then one line per change until
/// interrupted (or the stream ends). From an explicit revision, only the
/// changes after it.
pub async fn watch(
    client: &mut Client,
    output: Output,
    name: Option<String>,
    from_revision: i64,
) -> Result<(), ClientError> {
    let name = name.unwrap_or_default();
    let from_revision = if from_revision > 0 {
        from_revision
    } else {
        print_current(client, output, &name).await? + 1
    };
    stream_changes(client, output, name, from_revision).await
}

/// Prints the clusters `name` selects (all when empty) as they are now, a
/// PUT each, page by page; returns a store revision no later than the
/// read: a watch from the next one misses no change after it (one may show
/// twice, which a PUT survives).
async fn print_current(
    client: &mut Client,
    output: Output,
    name: &str,
) -> Result<i64, ClientError> {
    let print = |cluster: v1::Cluster| {
        let kind = v1::cluster_event::Kind::Put as i32;
        let revision = cluster.revision;
        let cluster = Some(cluster);
        print_event(
            output,
            &v1::ClusterEvent {
                kind,
                cluster,
                revision,
            },
        );
    };
    if name.is_empty() {
        let args = ListArgs {
            selector: String::new(),
            state: None,
            all: false,
            watch: false,
            page_size: 500,
            cached: false,
        };
        return for_each_page(client, &args, |page| page.into_iter().for_each(print)).await;
    }
    // One cluster: the revision from the cheapest list there is, then the
    // cluster, which may not exist yet.
    let probe = v1::ListClustersRequest {
        page_size: 1,
        linearizable: true,
        ..Default::default()
    };
    let revision = send(
        client,
        probe,
        |mut c, r| async move { c.list_clusters(r).await },
    )
    .await?
    .revision;
    match client
        .retrying_unavailable(|mut c| async move { c.get_cluster(name).await })
        .await
    {
        Ok(cluster) => print(cluster),
        Err(ClientError::Status(status)) if status.code() == tonic::Code::NotFound => {}
        Err(error) => return Err(error),
    }
    Ok(revision)
}

/// Streams the changes of `name` (all clusters when empty) after
/// `from_revision` (0: from now on).
async fn stream_changes(
    client: &mut Client,
    output: Output,
    name: String,
    from_revision: i64,
) -> Result<(), ClientError> {
    let request = v1::WatchClustersRequest {
        from_revision,
        name,
    };
    let mut events = send(client, request, |mut c, r| async move {
        Ok(c.clusters().watch_clusters(r).await?.into_inner())
    })
    .await?;
    while let Some(event) = events.message().await? {
        print_event(output, &event);
    }
    Ok(())
}

fn print_event(output: Output, event: &v1::ClusterEvent) {
    if output.line(event) {
        return;
    }
    let cluster = event.cluster.clone().unwrap_or_default();
    if output == Output::Name {
        outln!("{}", cluster.name);
        return;
    }
    let kind = v1::cluster_event::Kind::try_from(event.kind).map_or("?", |k| k.as_str_name());
    outln!(
        "{:<8} {:<8} {:<24} {:<24} gen {}",
        event.revision,
        kind,
        cluster.name,
        state_name(&cluster),
        cluster.generation
    );
}

/// The state, and `(paused)` after it when the cluster is paused.
fn state_name(cluster: &v1::Cluster) -> String {
    let state = cluster
        .status
        .as_ref()
        .and_then(|s| s.state)
        .and_then(|s| v1::ClusterState::try_from(s).ok())
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("CLUSTER_STATE_")
                .to_string()
        })
        .unwrap_or_default();
    match cluster.spec.as_ref().is_some_and(|spec| spec.paused) {
        true => format!("{state} (paused)"),
        false => state,
    }
}

/// A maintenance window as `cluster describe` shows it: its pairs and its
/// zone (`Sat-22:00..Sun-06:00 (Europe/Warsaw)`); `None` when there is none.
pub fn window_shown(window: Option<&v1::MaintenanceWindow>) -> Option<String> {
    let window = window.filter(|w| !w.window.is_empty())?;
    let pairs: Vec<String> = window
        .window
        .chunks(2)
        .map(|pair| pair.join(".."))
        .collect();
    let zone = match window.timezone.as_str() {
        "" => "UTC",
        zone => zone,
    };
    Some(format!("{} ({zone})", pairs.join(", ")))
}

/// The version column: the one running, and the one asked for when they
/// differ (an upgrade under way, cancelled or failed).
pub fn version_shown(cluster: &v1::Cluster) -> String {
    let desired = cluster
        .spec
        .as_ref()
        .map(|s| s.version.as_str())
        .unwrap_or_default();
    let current = cluster
        .status
        .as_ref()
        .and_then(|s| s.current_version.as_deref())
        .unwrap_or_default();
    match current {
        "" => desired.to_string(),
        current if current == desired => desired.to_string(),
        current => format!("{current} -> {desired}"),
    }
}

/// One cluster: the whole message with `-o json|yaml` (an object), its
/// name with `-o name`, otherwise a table of one row.
fn print_cluster(output: Output, cluster: v1::Cluster) {
    if output.messages(std::slice::from_ref(&cluster), false) {
        return;
    }
    let mut listing = ClusterListing::new(output);
    listing.page(&[cluster]);
    listing.end();
}

/// Clusters printed page by page as a listing arrives: whole messages with
/// `-o json|yaml` (one array, whatever its length), names with `-o name`,
/// otherwise a table (more columns with `-o wide`) with its header once.
struct ClusterListing {
    output: Output,
    messages: Listing,
    table: Table,
}

impl ClusterListing {
    fn new(output: Output) -> Self {
        let mut header = vec!["NAME", "STATE", "VERSION", "CONTROL", "WORKERS", "AGE"];
        if output.is_wide() {
            header.extend(["OFFERING", "OPERATION", "LABELS", "UID"]);
        }
        ClusterListing {
            output,
            messages: Listing::new(output),
            table: Table::new(header),
        }
    }

    /// Prints the next page; the first prints the table's header even
    /// when it is empty.
    fn page(&mut self, clusters: &[v1::Cluster]) {
        if self.messages.page(clusters) {
            return;
        }
        if self.output == Output::Name {
            clusters.iter().for_each(|c| outln!("{}", c.name));
            return;
        }
        for cluster in clusters {
            self.table.row(cluster_row(self.output, cluster));
        }
        self.table.print();
    }

    /// Ends the document of `-o json|yaml` (a table has nothing to end).
    fn end(self) {
        self.messages.end();
    }
}

fn cluster_row(output: Output, cluster: &v1::Cluster) -> Vec<String> {
    let spec = cluster.spec.clone().unwrap_or_default();
    let status = cluster.status.clone().unwrap_or_default();
    let mut row = vec![
        cluster.name.clone(),
        state_name(cluster),
        version_shown(cluster),
        spec.control_nodes.to_string(),
        spec.worker_nodes.to_string(),
        age(cluster.created_at.as_ref()),
    ];
    if output.is_wide() {
        let labels = label_pairs(&spec.labels);
        row.extend([
            spec.node_offering,
            status.current_operation.unwrap_or_else(|| "-".into()),
            labels.join(","),
            cluster.uid.clone(),
        ]);
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(desired: &str, current: Option<&str>) -> v1::Cluster {
        v1::Cluster {
            spec: Some(v1::ClusterSpec {
                version: desired.into(),
                ..Default::default()
            }),
            status: Some(v1::ClusterStatus {
                current_version: current.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// After a cancelled or failed upgrade the table must not show the
    /// desired version as if it ran.
    #[test]
    fn the_version_column_shows_where_an_upgrade_stands() {
        assert_eq!(
            version_shown(&cluster("1.30.0", Some("1.29.4"))),
            "1.29.4 -> 1.30.0"
        );
        assert_eq!(version_shown(&cluster("1.30.0", Some("1.30.0"))), "1.30.0");
        assert_eq!(version_shown(&cluster("1.30.0", None)), "1.30.0");
    }

    #[test]
    fn a_window_is_shown_by_its_pairs_in_its_zone() {
        let window = |bounds: &[&str], timezone: &str| v1::MaintenanceWindow {
            window: bounds.iter().map(|b| b.to_string()).collect(),
            timezone: timezone.into(),
        };
        assert_eq!(window_shown(None), None);
        assert_eq!(window_shown(Some(&window(&[], "Europe/Warsaw"))), None);
        assert_eq!(
            window_shown(Some(&window(&["Sat-22:00", "Sun-06:00"], "Europe/Warsaw"))).as_deref(),
            Some("Sat-22:00..Sun-06:00 (Europe/Warsaw)")
        );
        assert_eq!(
            window_shown(Some(&window(&["01:00", "05:00", "13:00", "14:00"], ""))).as_deref(),
            Some("01:00..05:00, 13:00..14:00 (UTC)")
        );
    }

    #[test]
    fn update_names_what_it_changes() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            command: ClusterCommand,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from(["cluster", "update", "web"].iter().chain(args))
                .map(|cli| match cli.command {
                    ClusterCommand::Update(args) => (args.window, args.timezone, args.no_window),
                    _ => unreachable!(),
                })
                .map_err(|e| e.kind())
        };
        let bounds = |b: &[&str]| b.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse(&[
                "--window",
                "Sat-22:00",
                "--window",
                "Sun-06:00",
                "--timezone",
                "Europe/Warsaw"
            ]),
            Ok((
                bounds(&["Sat-22:00", "Sun-06:00"]),
                Some("Europe/Warsaw".into()),
                false
            ))
        );
        assert_eq!(
            parse(&["--window", "01:00,05:00"]),
            Ok((bounds(&["01:00", "05:00"]), None, false))
        );
        assert_eq!(parse(&["--no-window"]), Ok((vec![], None, true)));
        assert!(parse(&[]).is_err(), "nothing to change");
        assert!(
            parse(&["--timezone", "UTC"]).is_err(),
            "a zone needs its window"
        );
        assert!(parse(&["--no-window", "--window", "01:00,02:00"]).is_err());
        assert!(parse(&["--label", "a=b", "--window", "01:00,02:00"]).is_ok());
    }

    /// `--health` and `--upgrade-policy` are whole policies read before
    /// anything is sent; `--no-health` and `--no-upgrade-policy` stand
    /// alone as changes and exclude their policy.
    #[test]
    fn policies_are_read_as_flags_of_create_and_update() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(subcommand)]
            command: ClusterCommand,
        }
        type Policies = (
            Option<v1::HealthPolicy>,
            Option<v1::UpgradePolicy>,
            bool,
            bool,
        );
        let update = |args: &[&str]| -> Result<Policies, clap::error::ErrorKind> {
            let cli = Cli::try_parse_from(["cluster", "update", "web"].iter().chain(args))
                .map_err(|e| e.kind())?;
            let ClusterCommand::Update(args) = cli.command else {
                unreachable!()
            };
            let PolicyArgs {
                health,
                upgrade_policy,
            } = args.policies;
            Ok((
                health,
                upgrade_policy,
                args.no_health,
                args.no_upgrade_policy,
            ))
        };
        let (health, upgrade, ..) = update(&[
            "--health",
            "unhealthy_timeout_seconds=120,remediation=replace",
        ])
        .unwrap();
        let health = health.expect("a health policy");
        assert_eq!(health.unhealthy_timeout_seconds, Some(120));
        assert_eq!(health.remediation, "replace");
        assert_eq!(upgrade, None, "the upgrade policy is left as it is");
        let (_, upgrade, ..) = update(&["--upgrade-policy", "max_surge=1"]).unwrap();
        assert_eq!(upgrade.unwrap().max_surge, Some(1));
        assert_eq!(update(&["--no-health"]), Ok((None, None, true, false)));
        assert_eq!(
            update(&["--no-upgrade-policy"]),
            Ok((None, None, false, true))
        );
        let invalid = Err(clap::error::ErrorKind::ValueValidation);
        assert_eq!(update(&["--health", "unhealthy_timeout=1"]), invalid);
        assert_eq!(update(&["--upgrade-policy", "max_surge=x"]), invalid);
        assert!(update(&["--no-health", "--health", "max_retry=0"]).is_err());
        let conflict = update(&["--no-upgrade-policy", "--upgrade-policy", "max_surge=1"]);
        assert!(conflict.is_err());

        let cli = Cli::try_parse_from([
            "cluster",
            "create",
            "web",
            "--version",
            "1.30.0",
            "--upgrade-policy",
            "max_surge=1",
            "--health",
            "max_retry=0",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let ClusterCommand::Create(args) = cli.command else {
            unreachable!()
        };
        assert_eq!(args.policies.upgrade_policy.unwrap().max_surge, Some(1));
        assert_eq!(args.policies.health.unwrap().max_retry, Some(0));
    }

    #[test]
    fn states_are_read_in_any_case_and_prefix() {
        for text in ["running", "Running", "CLUSTER_STATE_RUNNING"] {
            assert_eq!(parse_state(text), Ok(v1::ClusterState::Running), "{text}");
        }
        assert!(parse_state("unspecified").is_err());
        assert!(parse_state("sleeping").unwrap_err().contains("sleeping"));
    }
}
