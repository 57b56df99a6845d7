//! `droverctl rollout ...`: one change (an upgrade, or a new node offering)
//! carried across many clusters in stages by the Rollouts service: created
//! from flags or from a whole spec file, shown, listed, watched to its end,
//! paused, resumed, approved and cancelled; how rollouts are printed.

use crate::output::{age, field, Output, Table};
use crate::{enum_name, send, Failure};
use clap::{ArgGroup, Subcommand, ValueEnum};
use drover_client::{v1, Client, ClientError};
use std::collections::{HashMap, HashSet};
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Subcommand)]
pub enum RolloutCommand {
    /// Create a rollout, from flags or from a whole spec (-f); its targets
    /// are the clusters matching now.
    Create(Box<CreateArgs>),
    /// Show one rollout: state, each stage's counts, the failed clusters.
    Get { name: String },
    /// List the rollouts with their progress.
    List,
    /// Follow a rollout until it ends: one bar per stage, failures as they
    /// appear (one JSON object per update with -o json). Exits 0 only when
    /// it SUCCEEDED (9 otherwise).
    Watch { name: String },
    /// Start nothing new until resumed; running operations finish.
    Pause { name: String },
    /// Go on after a pause, by hand or by the failure budget (the failures
    /// so far are forgiven: the budget counts from here).
    Resume { name: String },
    /// Let a stage that requires approval start.
    Approve {
        name: String,
        /// The stage to let start.
        #[arg(long)]
        stage: String,
    },
    /// Start nothing new (the rollout ends CANCELLED).
    Cancel {
        name: String,
        /// Also cancel the operations running now.
        #[arg(long)]
        cancel_running: bool,
    },
}

/// The `--stage` syntax, shown under `rollout create --help`.
const CREATE_HELP: &str = "\
Stages (--stage, repeatable, in order; each target falls in the first stage whose selector it matches,
and every target must fall in one: leave the last stage's selector empty to take the rest):
  NAME                   DNS-1123, unique in the rollout; the only part required
  :max=N|P%              at most N operations at once, or P% of the stage's targets (rounded up) [default: 1]
  :soak=DURATION         the wait after the stage's last cluster ends: seconds, or 90s, 10m, 2h [default: 0]
  :approval              the stage starts only after `droverctl rollout approve NAME --stage STAGE`
  :selector=K=V[,K=V]    the targets this stage takes among those left [default: all left]

Examples:
  droverctl rollout create r131 -l fleet=prod --version 1.31.2 --max-failures 3 \\
      --stage canary:max=1:soak=1h:selector=ring=0 --stage rest:max=5%:approval
  droverctl rollout create big --cluster web-1,web-2 --node-offering large
  droverctl rollout create r131 -f r131.yaml";

/// `rollout create`: the spec from flags, or whole from a file. Exactly one
/// way of naming the targets and one change, counting the file as both.
#[derive(clap::Args)]
#[command(
    group(ArgGroup::new("targets").required(true).args(["selector", "clusters", "file"])),
    group(ArgGroup::new("change").required(true).args(["version", "node_offering", "file"])),
    after_help = CREATE_HELP
)]
pub struct CreateArgs {
    name: String,
    /// The whole spec (RolloutSpec), YAML or JSON, fields by their proto
    /// names: selector or clusters, version or node_offering, stages (name,
    /// selector, max_concurrency, soak_seconds, approval_required),
    /// max_failures, on_busy (ON_BUSY_WAIT or ON_BUSY_SKIP). `-` reads
    /// standard input.
    #[arg(
        short = 'f',
        long,
        value_name = "FILE",
        conflicts_with_all = ["stages", "max_failures", "on_busy"]
    )]
    file: Option<PathBuf>,
    /// The targets: the clusters carrying every label, k=v; repeatable or
    /// comma-separated.
    #[arg(
        long,
        short = 'l',
        value_name = "K=V",
        value_delimiter = ',',
        value_parser = parse_label
    )]
    selector: Vec<(String, String)>,
    /// The targets by name, instead of a selector; repeatable or
    /// comma-separated.
    #[arg(long = "cluster", value_name = "NAME", value_delimiter = ',')]
    clusters: Vec<String>,
    /// The change: upgrade every target to this version.
    #[arg(long)]
    version: Option<String>,
    /// The change: move every target to this node offering.
    #[arg(long)]
    node_offering: Option<String>,
    /// A stage, NAME[:max=N|P%][:soak=DURATION][:approval][:selector=K=V,...];
    /// repeatable, in order, at least one (see below).
    #[arg(
        long = "stage",
        value_name = "STAGE",
        value_parser = parse_stage,
        required_unless_present = "file"
    )]
    stages: Vec<v1::RolloutStage>,
    /// More failed clusters than this pause the rollout: a count, or a
    /// percentage of all targets (rounded down) [default: 0, the first
    /// failure pauses].
    #[arg(long, value_name = "N|P%", value_parser = parse_share)]
    max_failures: Option<String>,
    /// What to do with a target busy with another operation [default:
    /// wait].
    #[arg(long, value_enum)]
    on_busy: Option<OnBusy>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OnBusy {
    /// Wait until it is free.
    Wait,
    /// Skip it (SKIPPED).
    Skip,
}

impl OnBusy {
    fn proto(self) -> i32 {
        match self {
            OnBusy::Wait => v1::OnBusy::Wait as i32,
            OnBusy::Skip => v1::OnBusy::Skip as i32,
        }
    }
}

impl CreateArgs {
    /// The spec the file holds, or the one the flags describe.
    fn spec(self) -> Result<v1::RolloutSpec, Failure> {
        if let Some(path) = &self.file {
            return read_spec(path);
        }
        Ok(v1::RolloutSpec {
            selector: self.selector.into_iter().collect(),
            clusters: self.clusters,
            version: self.version.unwrap_or_default(),
            node_offering: self.node_offering.unwrap_or_default(),
            stages: self.stages,
            max_failures: self.max_failures.unwrap_or_default(),
            on_busy: self.on_busy.map_or(v1::OnBusy::Wait as i32, OnBusy::proto),
        })
    }
}

/// A `--selector` label, or one of a stage's: `key=value`, the key not
/// empty.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not key=value")),
    }
}

/// A stage's selector, `k=v,k2=v2`.
fn parse_labels(text: &str) -> Result<HashMap<String, String>, String> {
    text.split(',').map(parse_label).collect()
}

/// A `--stage` value, `NAME[:OPTION]...`: one flag per stage, short enough
/// to type, for what a spec file writes field by field. Each option at most
/// once; a typo is a usage error, not a setting silently lost.
fn parse_stage(text: &str) -> Result<v1::RolloutStage, String> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or_default();
    if name.is_empty() || name.contains('=') {
        return Err("the stage's name comes first, e.g. canary:max=1".into());
    }
    let mut stage = v1::RolloutStage {
        name: name.to_string(),
        ..Default::default()
    };
    let mut seen = HashSet::new();
    for option in parts {
        let (key, value) = match option.split_once('=') {
            Some((key, value)) => (key, Some(value)),
            None => (option, None),
        };
        if !seen.insert(key) {
            return Err(format!("{key} given twice"));
        }
        match (key, value) {
            ("max", Some(value)) => stage.max_concurrency = parse_share(value)?,
            ("soak", Some(value)) => stage.soak_seconds = parse_seconds(value)?,
            ("approval", None) => stage.approval_required = true,
            ("selector", Some(value)) => stage.selector = parse_labels(value)?,
            _ => {
                return Err(format!(
                "unknown option {option:?} (max=N|P%, soak=DURATION, approval, selector=K=V,...)"
            ))
            }
        }
    }
    Ok(stage)
}

/// A count ("3") or a percentage ("25%"), the form the API takes for
/// `max_concurrency` and `max_failures`: checked here so that a typo is a
/// usage error before anything is sent, and written as the API reads it
/// ("025%" is sent as "25%").
fn parse_share(text: &str) -> Result<String, String> {
    let invalid = || format!("{text:?} is not a count (3) or a percentage (25%)");
    match text.strip_suffix('%') {
        Some(percent) => match percent.parse::<u32>() {
            Ok(percent) if percent <= 100 => Ok(format!("{percent}%")),
            Ok(_) => Err(format!("{text:?}: a percentage is at most 100%")),
            Err(_) => Err(invalid()),
        },
        None => text
            .parse::<u32>()
            .map(|count| count.to_string())
            .map_err(|_| invalid()),
    }
}

/// A soak time in seconds: a bare number of seconds, or one with a unit
/// (`90s`, `10m`, `2h`), since soaks are minutes to hours long.
pub(crate) fn parse_seconds(text: &str) -> Result<u32, String> {
    let (number, scale) = match text.char_indices().last() {
        Some((at, 's')) => (&text[..at], 1),
        Some((at, 'm')) => (&text[..at], 60),
        Some((at, 'h')) => (&text[..at], 3600),
        _ => (text, 1),
    };
    number
        .parse::<u32>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("{text:?} is not a duration (600, 90s, 10m, 2h)"))
}

/// The spec in a file, or on standard input for `-`. An unreadable file is
/// a local failure (nothing was sent); one that is not a spec, a usage
/// error naming what is wrong.
fn read_spec(path: &Path) -> Result<v1::RolloutSpec, Failure> {
    let shown = path.display();
    let mut text = String::new();
    let read = if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(drop)
    } else {
        std::fs::read_to_string(path).map(|read| text = read)
    };
    read.map_err(|e| Failure::LocalFile(format!("-f: cannot read {shown}: {e}")))?;
    parse_spec(&text).map_err(|e| Failure::Usage(format!("-f {shown}: not a rollout spec: {e}")))
}

/// JSON when the text starts with `{`, YAML otherwise (serde_json names
/// JSON's errors better than a YAML parser would). Both go through the
/// generated serde impls: proto field names, unknown fields refused.
fn parse_spec(text: &str) -> Result<v1::RolloutSpec, String> {
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| e.to_string())
    } else {
        yaml_serde::from_str(text).map_err(|e| e.to_string())
    }
}

pub async fn run(
    client: &mut Client,
    output: Output,
    command: RolloutCommand,
) -> Result<(), Failure> {
    // Changes are sent once, not again while no replica answers (as `send`
    // does): they carry no request id, so a second send of one carried out
    // would fail (ALREADY_EXISTS) or act twice.
    let rollout = match command {
        RolloutCommand::Create(args) => Ok(create(client, output, *args).await?),
        RolloutCommand::Get { name } => return Ok(get(client, output, name).await?),
        RolloutCommand::List => return Ok(list(client, output).await?),
        RolloutCommand::Watch { name } => return watch(client, output, name).await,
        RolloutCommand::Pause { name } => {
            let request = v1::PauseRolloutRequest { name };
            client.rollouts().pause_rollout(request).await
        }
        RolloutCommand::Resume { name } => {
            let request = v1::ResumeRolloutRequest { name };
            client.rollouts().resume_rollout(request).await
        }
        RolloutCommand::Approve { name, stage } => {
            let request = v1::ApproveRolloutRequest { name, stage };
            client.rollouts().approve_rollout(request).await
        }
        RolloutCommand::Cancel {
            name,
            cancel_running,
        } => {
            let request = v1::CancelRolloutRequest {
                name,
                cancel_running,
            };
            client.rollouts().cancel_rollout(request).await
        }
    }
    .map_err(ClientError::from)?
    .into_inner();
    print_state_line(output, &rollout);
    Ok(())
}

/// `rollout create`: reads the spec (before sending anything), sends it,
/// and says how to follow the rollout.
async fn create(
    client: &mut Client,
    output: Output,
    args: CreateArgs,
) -> Result<tonic::Response<v1::Rollout>, Failure> {
    let name = args.name.clone();
    let request = v1::CreateRolloutRequest {
        name: name.clone(),
        spec: Some(args.spec()?),
    };
    let created = client
        .rollouts()
        .create_rollout(request)
        .await
        .map_err(ClientError::from)?;
    if !matches!(output, Output::Json | Output::Yaml) {
        let _ = writeln!(
            std::io::stderr(),
            "follow it: droverctl rollout watch {name}"
        );
    }
    Ok(created)
}

async fn get(client: &mut Client, output: Output, name: String) -> Result<(), ClientError> {
    let rollout = send(
        client,
        v1::GetRolloutRequest { name },
        |mut c, r| async move { Ok(c.rollouts().get_rollout(r).await?.into_inner()) },
    )
    .await?;
    if output.messages(std::slice::from_ref(&rollout), false) {
        return Ok(());
    }
    if output == Output::Name {
        outln!("{}", rollout.name);
        return Ok(());
    }
    print_details(&rollout);
    Ok(())
}

/// `rollout get`'s page: the rollout, its stages, its failed clusters.
fn print_details(rollout: &v1::Rollout) {
    let spec = rollout.spec.clone().unwrap_or_default();
    let status = rollout.status.clone().unwrap_or_default();
    field(0, "Name", &rollout.name);
    field(0, "UID", &rollout.uid);
    field(
        0,
        "Created",
        &format!("{} ago", age(rollout.created_at.as_ref())),
    );
    field(0, "Targets", &targets_shown(&spec));
    field(0, "Change", &change_shown(&spec));
    field(0, "Max failures", &spec.max_failures);
    field(0, "State", &state_name(status.state));
    field(0, "Message", &status.message);
    field(0, "Owner", &status.owner);
    outln!("Stages:");
    print_stages(&status.stages);
    outln!("Failed clusters:");
    print_failed(&status.clusters);
}

/// The targets as the spec names them: the selector, or the clusters (how
/// many, past a handful).
fn targets_shown(spec: &v1::RolloutSpec) -> String {
    match spec.clusters.len() {
        0 => format!("selector {}", labels_shown(&spec.selector)),
        n if n <= 5 => spec.clusters.join(", "),
        n => format!(
            "{n} clusters by name ({}, ...)",
            spec.clusters[..3].join(", ")
        ),
    }
}

fn change_shown(spec: &v1::RolloutSpec) -> String {
    if spec.node_offering.is_empty() {
        format!("version {}", spec.version)
    } else {
        format!("node offering {}", spec.node_offering)
    }
}

/// Labels as `k=v,k2=v2`, sorted, so the same selector always reads alike.
fn labels_shown(labels: &HashMap<String, String>) -> String {
    let mut pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(",")
}

fn print_stages(stages: &[v1::StageStatus]) {
    if stages.is_empty() {
        outln!("  (none)");
        return;
    }
    let mut table = Table::new([
        "  STAGE",
        "TARGETS",
        "PENDING",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "SKIPPED",
        "ELAPSED",
    ]);
    for s in stages {
        table.row([
            format!("  {}", s.name),
            s.targets.to_string(),
            s.pending.to_string(),
            s.running.to_string(),
            s.succeeded.to_string(),
            s.failed.to_string(),
            s.skipped.to_string(),
            stage_elapsed(s).map_or_else(|| "-".into(), duration_shown),
        ]);
    }
    table.print();
}

fn print_failed(clusters: &[v1::RolloutCluster]) {
    let failed: Vec<&v1::RolloutCluster> = clusters.iter().filter(|c| is_failed(c)).collect();
    if failed.is_empty() {
        outln!("  (none)");
        return;
    }
    let mut table = Table::new(["  CLUSTER", "STAGE", "OPERATION", "MESSAGE"]);
    for c in failed {
        table.row([
            format!("  {}", c.cluster),
            c.stage.clone(),
            c.operation_id.clone(),
            c.message.clone(),
        ]);
    }
    table.print();
}

fn is_failed(cluster: &v1::RolloutCluster) -> bool {
    cluster.state == v1::TargetState::TargetFailed as i32
}

/// How long a stage has run: to its end, or to now while it runs; None
/// before it starts.
fn stage_elapsed(stage: &v1::StageStatus) -> Option<Duration> {
    let started = stage.started_at.as_ref()?.seconds;
    let ended = stage
        .finished_at
        .as_ref()
        .map_or_else(now_seconds, |t| t.seconds);
    Some(Duration::from_secs(
        ended.saturating_sub(started).max(0) as u64
    ))
}

fn now_seconds() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// `42s`, `3m05s`, `2h07m`: precise enough for stages that run minutes to
/// hours, short enough for a column.
fn duration_shown(elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

async fn list(client: &mut Client, output: Output) -> Result<(), ClientError> {
    let rollouts = send(client, v1::ListRolloutsRequest {}, |mut c, r| async move {
        Ok(c.rollouts().list_rollouts(r).await?.into_inner().rollouts)
    })
    .await?;
    if output.messages(&rollouts, true) {
        return Ok(());
    }
    if output == Output::Name {
        rollouts.iter().for_each(|r| outln!("{}", r.name));
        return Ok(());
    }
    let mut header = vec!["NAME", "STATE", "PROGRESS", "AGE"];
    if output.is_wide() {
        header.extend(["CHANGE", "OWNER", "MESSAGE"]);
    }
    let mut table = Table::new(header);
    for rollout in &rollouts {
        let status = rollout.status.clone().unwrap_or_default();
        let (done, targets) = progress(&status.stages);
        let mut row = vec![
            rollout.name.clone(),
            state_name(status.state),
            format!("{done}/{targets}"),
            age(rollout.created_at.as_ref()),
        ];
        if output.is_wide() {
            let spec = rollout.spec.clone().unwrap_or_default();
            row.extend([change_shown(&spec), status.owner, status.message]);
        }
        table.row(row);
    }
    table.print();
    Ok(())
}

/// Targets done (succeeded, failed or skipped) and targets in all.
fn progress(stages: &[v1::StageStatus]) -> (u32, u32) {
    stages.iter().fold((0, 0), |(done, targets), s| {
        (
            done + s.succeeded + s.failed + s.skipped,
            targets + s.targets,
        )
    })
}

fn state_name(state: i32) -> String {
    enum_name(
        v1::RolloutState::try_from(state).map(|s| s.as_str_name()),
        "ROLLOUT_",
    )
}

fn has_ended(rollout: &v1::Rollout) -> bool {
    use v1::RolloutState::{RolloutCancelled, RolloutFailed, RolloutSucceeded};
    let state = rollout.status.as_ref().map_or(0, |s| s.state);
    [RolloutSucceeded, RolloutFailed, RolloutCancelled]
        .contains(&v1::RolloutState::try_from(state).unwrap_or(v1::RolloutState::Unspecified))
}

/// The rollout's state in one line (`r131 PAUSED: paused by hand`), the
/// answer to a change; the whole rollout with `-o json|yaml`.
fn print_state_line(output: Output, rollout: &v1::Rollout) {
    if output.messages(std::slice::from_ref(rollout), false) {
        return;
    }
    if output == Output::Name {
        outln!("{}", rollout.name);
        return;
    }
    outln!("{}", state_line(rollout));
}

fn state_line(rollout: &v1::Rollout) -> String {
    let status = rollout.status.clone().unwrap_or_default();
    let state = state_name(status.state);
    match status.message.as_str() {
        "" => format!("{} {state}", rollout.name),
        message => format!("{} {state}: {message}", rollout.name),
    }
}

/// `rollout watch`: the rollout's progress until it ends; one that ends
/// other than SUCCEEDED fails the command. Ctrl-C stops the watching, not
/// the rollout: droverctl says so and how to watch it again.
async fn watch(client: &mut Client, output: Output, name: String) -> Result<(), Failure> {
    let mut progress = Progress::new();
    let followed = follow_to_end(client, output, &name, &mut progress);
    let last = tokio::select! {
        last = followed => last?,
        _ = tokio::signal::ctrl_c() => {
            progress.abandon();
            let _ = writeln!(
                std::io::stderr(),
                "droverctl: stopped watching; rollout {name} goes on. Watch it again with: droverctl rollout watch {name}"
            );
            std::process::exit(130);
        }
    };
    progress.finish(&last);
    if !matches!(output, Output::Json | Output::Yaml) {
        print_state_line(output, &last);
    }
    let status = last.status.unwrap_or_default();
    if status.state == v1::RolloutState::RolloutSucceeded as i32 {
        return Ok(());
    }
    Err(Failure::RolloutEnded {
        name,
        state: state_name(status.state),
        message: status.message,
    })
}

/// How long to wait before opening a watch again that ended early.
const REOPEN_DELAY: Duration = Duration::from_millis(500);

/// Shows each update of the rollout until it ends, and returns the last.
/// A watch that breaks off (its replica went away) or ends before the
/// rollout does is opened again: it starts with the rollout as it is, so
/// nothing is missed (with `-o json`, an update may show twice).
async fn follow_to_end(
    client: &Client,
    output: Output,
    name: &str,
    progress: &mut Progress,
) -> Result<v1::Rollout, ClientError> {
    loop {
        let request = v1::WatchRolloutRequest {
            name: name.to_string(),
        };
        let mut updates = send(client, request, |mut c, r| async move {
            Ok(c.rollouts().watch_rollout(r).await?.into_inner())
        })
        .await?;
        loop {
            match updates.message().await {
                Ok(Some(rollout)) => {
                    if !output.line(&rollout) {
                        progress.show(&rollout);
                    }
                    if has_ended(&rollout) {
                        return Ok(rollout);
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    let error = ClientError::from(status);
                    if !error.is_unavailable() {
                        return Err(error);
                    }
                    break;
                }
            }
        }
        tokio::time::sleep(REOPEN_DELAY).await;
    }
}

/// A watched rollout's progress on standard error (standard output stays
/// for the result): on a terminal, a line with the rollout's state and one
/// bar per stage (targets done, counts, elapsed), redrawn in place, with
/// each failed cluster printed above the bars as it fails; otherwise (logs,
/// CI) one line per change.
struct Progress {
    terminal: bool,
    /// Created at the first update, when the stages are known.
    bars: Option<Bars>,
    /// Off a terminal: the lines last printed, so only changes are printed.
    lines: Vec<String>,
    /// The failed clusters already reported.
    failures: HashSet<String>,
}

struct Bars {
    multi: indicatif::MultiProgress,
    state: indicatif::ProgressBar,
    stages: Vec<indicatif::ProgressBar>,
}

impl Progress {
    fn new() -> Self {
        Self {
            terminal: std::io::stderr().is_terminal(),
            bars: None,
            lines: Vec::new(),
            failures: HashSet::new(),
        }
    }

    fn show(&mut self, rollout: &v1::Rollout) {
        let status = rollout.status.clone().unwrap_or_default();
        self.report_failures(&status.clusters);
        let mut lines = vec![format!("rollout {}", state_line(rollout))];
        lines.extend(status.stages.iter().map(stage_line));
        if !self.terminal {
            for line in lines.iter().filter(|l| !self.lines.contains(l)) {
                // Progress is a courtesy: a closed standard error does not
                // stop the command.
                let _ = writeln!(std::io::stderr(), "{line}");
            }
            self.lines = lines;
            return;
        }
        let bars = self.bars.get_or_insert_with(Bars::new);
        bars.state.set_message(lines[0].clone());
        for (at, stage) in status.stages.iter().enumerate() {
            update_stage_bar(bars.stage(at), stage);
        }
    }

    /// Prints each failed cluster once, with its message, as it appears.
    fn report_failures(&mut self, clusters: &[v1::RolloutCluster]) {
        for c in clusters.iter().filter(|c| is_failed(c)) {
            if !self.failures.insert(c.cluster.clone()) {
                continue;
            }
            let line = format!("FAILED {} (stage {}): {}", c.cluster, c.stage, c.message);
            match &self.bars {
                Some(bars) => {
                    let _ = bars.multi.println(line);
                }
                None => {
                    let _ = writeln!(std::io::stderr(), "{line}");
                }
            }
        }
    }

    /// The last frame shows how each stage stood when the rollout ended
    /// (a stage that had ended already keeps its frame and its elapsed).
    fn finish(&self, rollout: &v1::Rollout) {
        let Some(bars) = &self.bars else { return };
        for bar in bars.stages.iter().filter(|bar| !bar.is_finished()) {
            bar.abandon();
        }
        bars.state
            .abandon_with_message(format!("rollout {}", state_line(rollout)));
    }

    fn abandon(&self) {
        let Some(bars) = &self.bars else { return };
        bars.stages.iter().for_each(indicatif::ProgressBar::abandon);
        bars.state.abandon_with_message("interrupted");
    }
}

/// One stage off a terminal: `canary: 2/3 done (running 1, succeeded 1,
/// failed 0, skipped 1, pending 0) 1m05s`.
fn stage_line(stage: &v1::StageStatus) -> String {
    let done = stage.succeeded + stage.failed + stage.skipped;
    let elapsed =
        stage_elapsed(stage).map_or_else(String::new, |e| format!(" {}", duration_shown(e)));
    format!(
        "{}: {done}/{} done ({}){elapsed}",
        stage.name,
        stage.targets,
        stage_counts(stage)
    )
}

fn stage_counts(stage: &v1::StageStatus) -> String {
    format!(
        "running {}, succeeded {}, failed {}, skipped {}, pending {}",
        stage.running, stage.succeeded, stage.failed, stage.skipped, stage.pending
    )
}

/// A stage's counts beside its bar, the ones that are not zero, short
/// enough for an 80-column terminal: `4 ok, 1 failed, 1 running`.
fn bar_counts(stage: &v1::StageStatus) -> String {
    let counts = [
        (stage.succeeded, "ok"),
        (stage.failed, "failed"),
        (stage.skipped, "skipped"),
        (stage.running, "running"),
    ];
    let shown: Vec<String> = counts
        .iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect();
    shown.join(", ")
}

impl Bars {
    fn new() -> Self {
        let multi = indicatif::MultiProgress::new();
        let style =
            indicatif::ProgressStyle::with_template("{wide_msg}").expect("a valid template");
        let state = multi.add(indicatif::ProgressBar::new(1).with_style(style));
        Self {
            multi,
            state,
            stages: Vec::new(),
        }
    }

    /// The bar of the stage at `at`, added when first needed.
    fn stage(&mut self, at: usize) -> &indicatif::ProgressBar {
        while self.stages.len() <= at {
            let bar = indicatif::ProgressBar::new(1).with_style(stage_style(false));
            self.stages.push(self.multi.add(bar));
        }
        &self.stages[at]
    }
}

/// A stage's bar: with its elapsed time once it has started (ticking from
/// the server's start time while it runs), without before.
fn stage_style(started: bool) -> indicatif::ProgressStyle {
    let template = if started {
        "{prefix:<10} {elapsed:>5} [{bar:20}] {pos}/{len} {wide_msg}"
    } else {
        "{prefix:<10}       [{bar:20}] {pos}/{len} {wide_msg}"
    };
    indicatif::ProgressStyle::with_template(template)
        .expect("a valid template")
        .progress_chars("#>.")
}

/// Updates a stage's bar from its status: the elapsed time first (from the
/// server's start time, so a bar drawn late shows it right), then the
/// counts. A stage that ended is left as it ended, no longer ticking or
/// redrawn.
fn update_stage_bar(bar: &indicatif::ProgressBar, stage: &v1::StageStatus) {
    if bar.is_finished() {
        return;
    }
    if let Some(elapsed) = stage_elapsed(stage) {
        bar.set_style(stage_style(true));
        bar.set_elapsed(elapsed);
    }
    bar.set_prefix(stage.name.clone());
    bar.set_length(u64::from(stage.targets));
    bar.set_position(u64::from(stage.succeeded + stage.failed + stage.skipped));
    bar.set_message(bar_counts(stage));
    match (&stage.started_at, &stage.finished_at) {
        (_, Some(_)) => bar.abandon(),
        (Some(_), None) => bar.enable_steady_tick(Duration::from_secs(1)),
        (None, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_flag_carries_every_option() {
        let stage = parse_stage("canary:max=1:approval:soak=60:selector=ring=0,zone=a").unwrap();
        assert_eq!(stage.name, "canary");
        assert_eq!(stage.max_concurrency, "1");
        assert!(stage.approval_required);
        assert_eq!(stage.soak_seconds, 60);
        let selector: HashMap<String, String> = [("ring", "0"), ("zone", "a")]
            .map(|(k, v)| (k.into(), v.into()))
            .into();
        assert_eq!(stage.selector, selector);
    }

    #[test]
    fn a_bare_stage_name_takes_the_api_defaults() {
        let stage = parse_stage("rest").unwrap();
        assert_eq!(
            stage,
            v1::RolloutStage {
                name: "rest".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn stage_flag_mistakes_are_refused() {
        for (text, says) in [
            ("", "name comes first"),
            ("max=1", "name comes first"),
            ("canary:max=1:max=2", "max given twice"),
            ("canary:approval=yes", "unknown option"),
            ("canary:maxx=1", "unknown option"),
            ("canary:soak", "unknown option"),
            ("canary:max=one", "not a count"),
            ("canary:soak=1d", "not a duration"),
            ("canary:selector=ring", "not key=value"),
        ] {
            let error = parse_stage(text).unwrap_err();
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    #[test]
    fn soaks_take_seconds_or_a_unit() {
        assert_eq!(parse_seconds("600"), Ok(600));
        assert_eq!(parse_seconds("90s"), Ok(90));
        assert_eq!(parse_seconds("10m"), Ok(600));
        assert_eq!(parse_seconds("2h"), Ok(7200));
        assert!(parse_seconds("m").is_err());
        assert!(parse_seconds("5000000h").is_err(), "overflow");
    }

    #[test]
    fn shares_are_counts_or_percentages_up_to_100() {
        assert_eq!(parse_share("3"), Ok("3".into()));
        assert_eq!(parse_share("0"), Ok("0".into()));
        assert_eq!(parse_share("25%"), Ok("25%".into()));
        assert_eq!(parse_share("025%"), Ok("25%".into()));
        assert_eq!(parse_share("100%"), Ok("100%".into()));
        assert!(parse_share("101%").unwrap_err().contains("at most 100%"));
        for text in ["", "%", "-1", "2.5", "25 %", "a%", "3x"] {
            assert!(parse_share(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn labels_need_a_key() {
        assert_eq!(
            parse_label("fleet=prod"),
            Ok(("fleet".into(), "prod".into()))
        );
        assert_eq!(parse_label("empty="), Ok(("empty".into(), String::new())));
        assert!(parse_label("=prod").is_err());
        assert!(parse_label("fleet").is_err());
    }

    /// The spec the README shows: what `rollout create -f` must read.
    const YAML_SPEC: &str = r#"
selector: {fleet: prod}
version: 1.31.2
stages:
  - name: canary
    selector: {ring: "0"}
    max_concurrency: "1"
    soak_seconds: 3600
  - name: rest
    max_concurrency: "5%"
    approval_required: true
max_failures: "3"
on_busy: ON_BUSY_SKIP
"#;

    fn expected_spec() -> v1::RolloutSpec {
        v1::RolloutSpec {
            selector: [("fleet".to_string(), "prod".to_string())].into(),
            version: "1.31.2".into(),
            stages: vec![
                v1::RolloutStage {
                    name: "canary".into(),
                    selector: [("ring".to_string(), "0".to_string())].into(),
                    max_concurrency: "1".into(),
                    soak_seconds: 3600,
                    approval_required: false,
                },
                v1::RolloutStage {
                    name: "rest".into(),
                    max_concurrency: "5%".into(),
                    approval_required: true,
                    ..Default::default()
                },
            ],
            max_failures: "3".into(),
            on_busy: v1::OnBusy::Skip as i32,
            ..Default::default()
        }
    }

    /// Through a real file, as `-f FILE` reads it.
    fn read_spec_file(text: &str, extension: &str) -> Result<v1::RolloutSpec, Failure> {
        let name = format!("droverctl-spec-{}.{extension}", std::process::id());
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, text).unwrap();
        let spec = read_spec(&path);
        std::fs::remove_file(path).unwrap();
        spec
    }

    #[test]
    fn a_spec_file_in_yaml_is_read() {
        assert_eq!(read_spec_file(YAML_SPEC, "yaml").unwrap(), expected_spec());
    }

    #[test]
    fn a_spec_file_in_json_is_read() {
        let json = serde_json::to_string_pretty(&expected_spec()).unwrap();
        assert_eq!(read_spec_file(&json, "json").unwrap(), expected_spec());
        let by_hand = r#"{"clusters": ["a", "b"], "node_offering": "large"}"#;
        let spec = parse_spec(by_hand).unwrap();
        assert_eq!(spec.clusters, ["a", "b"]);
        assert_eq!(spec.node_offering, "large");
    }

    #[test]
    fn a_misspelt_spec_field_is_refused_not_dropped() {
        let error = parse_spec("versoin: 1.31.2\nselector: {fleet: prod}\n").unwrap_err();
        assert!(error.contains("versoin"), "{error}");
        let error = parse_spec(r#"{"stages": [{"name": "a", "max": "1"}]}"#).unwrap_err();
        assert!(error.contains("max"), "{error}");
    }

    #[test]
    fn an_unreadable_spec_file_is_a_local_failure() {
        let missing = std::env::temp_dir().join("droverctl-no-such-spec.yaml");
        assert!(matches!(read_spec(&missing), Err(Failure::LocalFile(_))));
    }

    #[test]
    fn progress_counts_every_ended_target() {
        let stage = |targets, succeeded, failed, skipped| v1::StageStatus {
            targets,
            succeeded,
            failed,
            skipped,
            ..Default::default()
        };
        assert_eq!(progress(&[stage(1, 1, 0, 0), stage(10, 3, 1, 2)]), (7, 11));
        assert_eq!(progress(&[]), (0, 0));
    }

    #[test]
    fn bars_show_only_the_counts_that_are_not_zero() {
        let stage = v1::StageStatus {
            succeeded: 4,
            failed: 1,
            running: 2,
            pending: 3,
            ..Default::default()
        };
        assert_eq!(bar_counts(&stage), "4 ok, 1 failed, 2 running");
        assert_eq!(bar_counts(&v1::StageStatus::default()), "");
    }

    #[test]
    fn elapsed_times_fit_a_column() {
        assert_eq!(duration_shown(Duration::from_secs(42)), "42s");
        assert_eq!(duration_shown(Duration::from_secs(185)), "3m05s");
        assert_eq!(duration_shown(Duration::from_secs(7620)), "2h07m");
    }
}
