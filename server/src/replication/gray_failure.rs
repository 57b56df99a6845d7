//! Gray failures: a replica that keeps its lease but cannot reach a
//! provider. Its operations would wait for the provider (each call is sent
//! again until the operation's timeout) while a peer could run them. So
//! every provider is probed every few seconds (a quarter of
//! `--provider-handover-after`, at most 5 s). This replica's member record
//! lists the providers it has been failing to reach for a while, and those
//! it has not reached for longer than `--provider-handover-after`. While
//! another member reaches every provider, peers prefer one with such a
//! long failure for no cluster: it releases what it owns (a running
//! operation included, which the next owner resumes from its last
//! persisted step, as after a lost owner) and claims nothing until it
//! reaches them again.
//!
//! Hysteresis, so that a flapping probe does not move clusters to and fro
//! (each move a new epoch, each operation caught in it a resume): a
//! provider is *failing* once probes have failed across one probe period
//! (two in a row), *unreachable* once they have failed across
//! `--provider-handover-after`, and reached again only after a run of
//! [`RECOVERY_RUN`] successful probes. `drover_clusters_claimed_total`
//! counts the owner changes this replica makes.
//!
//! # Guarantees
//! - A provider that no member reaches is down, not cut off: nobody is
//!   passed over for it, and clusters do not move around for it. Every
//!   member's probes have failed across a period within three periods
//!   (a probe gives up after half a period), before anyone's failures
//!   last `--provider-handover-after` (four periods).
//! - One failed probe, or one that succeeds amid failures, changes
//!   nothing any member publishes.
//! - A released cluster's operation is resumed by its next owner only
//!   after that owner fenced the provider under its newer epoch, so a call
//!   this replica still has in flight cannot land after the new owner's.
//! - Each hand-over of a running operation counts as a resume towards
//!   `--orphan-resume-limit`: a provider that flaps cannot move an
//!   operation around for ever.
//!
//! # Assumptions
//! - A probe (GetCapabilities, any answer counts, UNIMPLEMENTED included)
//!   reaches the provider exactly when the provider calls would.
//!
//! # Caveats
//! - The preference is per member, not per provider: with several
//!   providers, a member that cannot reach one of them hands over its
//!   clusters of every provider.
//! - A member whose provider is back is passed over for [`RECOVERY_RUN`]
//!   more probes.

use super::*;
use crate::cluster::ClusterCache;
use crate::provider::{Link, Providers};
use tokio::sync::watch;

/// The longest time between two probes of a provider.
const MAX_PROBE_PERIOD: Duration = Duration::from_secs(5);

/// Successful probes in a row after which a failing provider counts as
/// reached again: four probe periods, about `--provider-handover-after`,
/// as long as failures take to make it unreachable.
pub const RECOVERY_RUN: u32 = 5;

/// One provider's recent probes.
#[derive(Debug, Default, Clone, Copy)]
struct Probes {
    /// The first and the last failure of the current run of failures
    /// (kept through a recovery run until it completes).
    failures: Option<(Instant, Instant)>,
    /// Successes in a row since the last failure, while failing.
    successes: u32,
}

impl Probes {
    fn note(&mut self, reached: bool, now: Instant, period: Duration) {
        if !reached {
            let first = self.failures.map_or(now, |(first, _)| first);
            self.failures = Some((first, now));
            self.successes = 0;
            return;
        }
        // A failure that did not last a period is forgotten at once; a
        // longer run of failures takes a run of successes to forget.
        self.successes += 1;
        if self.failing_for() < period || self.successes >= RECOVERY_RUN {
            *self = Self::default();
        }
    }

    /// How long the current run of failures has lasted.
    fn failing_for(&self) -> Duration {
        self.failures.map_or(Duration::ZERO, |(first, last)| {
            last.saturating_duration_since(first)
        })
    }
}

impl Ownership {
    /// Probes every provider until `shutdown` turns true, and publishes in
    /// this replica's member record those failing and those not reached
    /// for `after`.
    pub async fn run_provider_probes(
        self: Arc<Self>,
        providers: Arc<Providers>,
        cache: Arc<ClusterCache>,
        after: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let period = (after / 4).min(MAX_PROBE_PERIOD);
        let mut probes: HashMap<String, Probes> = HashMap::new();
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(period) => {}
            }
            for (link, _) in providers.links() {
                let reached = probe(link, period / 2).await;
                let entry = probes.entry(link.name.clone()).or_default();
                entry.note(reached, Instant::now(), period);
            }
            let reach = reach(&probes, period, after);
            let cut_off = !reach.unreachable.is_empty();
            self.publish_reach(reach).await;
            // Right after a failed probe, not in the ownership pass: a
            // provider back for a peer a moment ago is likely back here
            // too, and the next probe says so before anything moves.
            if cut_off && !self.is_draining() {
                if let Err(error) = self.hand_over_if_passed_over(&cache).await {
                    tracing::warn!(%error, "cannot hand clusters over; retrying at the next probe");
                }
            }
        }
    }

    /// Releases every owned cluster, busy or not, when the member records
    /// show this replica passed over: it cannot do their work, a peer can.
    async fn hand_over_if_passed_over(&self, cache: &ClusterCache) -> crate::store::Result<()> {
        let members = self.read_members().await?.records;
        if self.passed_over(&members) && !lock(&self.owned).is_empty() {
            let left = self.release_unbusy(cache, |_| false).await?;
            tracing::warn!(
                left,
                "handed clusters over to peers that reach every provider"
            );
        }
        Ok(())
    }

    /// Writes `reach` into this replica's member record when it changed
    /// (again at the next probe if the write fails).
    async fn publish_reach(&self, reach: ProviderReach) {
        let previous = {
            let mut published = lock(&self.provider_reach);
            if *published == reach {
                return;
            }
            std::mem::replace(&mut *published, reach.clone())
        };
        self.metrics
            .providers_unreachable
            .set(reach.unreachable.len() as i64);
        match self.rewrite_member_record().await {
            Ok(true) if reach.unreachable != previous.unreachable => {
                match reach.unreachable.is_empty() {
                    true => tracing::info!("every provider reached again: claiming clusters again"),
                    false => {
                        tracing::warn!(providers = ?reach.unreachable, "providers not reached for longer than --provider-handover-after: handing clusters over to peers that reach them")
                    }
                }
            }
            Ok(true) => {}
            // No session now (the next join writes the record whole), or
            // the record is another incarnation's: tried again next probe.
            Ok(false) => *lock(&self.provider_reach) = previous,
            Err(error) => {
                tracing::warn!(%error, "cannot publish the providers this replica cannot reach; retrying");
                *lock(&self.provider_reach) = previous;
            }
        }
    }

    /// Whether this replica, which cannot reach a provider, is passed over
    /// because a member reaching every provider exists (as `members` shows).
    fn passed_over(&self, members: &[MemberRecord]) -> bool {
        let me = members
            .iter()
            .find(|m| m.id == self.config.replica_id && !m.draining);
        me.is_some_and(|me| !me.unreachable_providers.is_empty()) && any_reaches_all(members)
    }
}

/// What `probes` say, names in order: failing once a run of failures
/// spans a probe `period`, unreachable once it spans `after`.
fn reach(probes: &HashMap<String, Probes>, period: Duration, after: Duration) -> ProviderReach {
    let mut reach = ProviderReach::default();
    for (name, probes) in probes {
        let failing_for = probes.failing_for();
        if failing_for >= period {
            reach.failing.push(name.clone());
        }
        if failing_for >= after {
            reach.unreachable.push(name.clone());
        }
    }
    reach.failing.sort();
    reach.unreachable.sort();
    reach
}

/// The members ownership prefers among: those not draining, and of those,
/// when any reaches every provider, all but those that have not reached
/// one for long. A member whose probes only began to fail is not passed
/// over, and does not count as reaching: when the provider goes away for
/// everyone, every member sees it fail within a probe or two, long before
/// the first one's failures last `--provider-handover-after`, and nobody
/// is passed over.
pub(super) fn preferable(members: &[MemberRecord]) -> Vec<&MemberRecord> {
    let reaching = any_reaches_all(members);
    members
        .iter()
        .filter(|m| !m.draining && !m.unwatched)
        .filter(|m| !reaching || m.unreachable_providers.is_empty())
        .collect()
}

fn any_reaches_all(members: &[MemberRecord]) -> bool {
    members.iter().any(|m| {
        !m.draining && m.failing_providers.is_empty() && m.unreachable_providers.is_empty()
    })
}

/// Whether `link`'s provider answers within `timeout`: any answer but
/// "unavailable" (a connection refused or broken) counts.
async fn probe(link: &Link, timeout: Duration) -> bool {
    let request = drover_proto::provider::v1::GetCapabilitiesRequest {};
    let mut client = link.client();
    // Bounded here, not by the request's grpc-timeout alone: a silently
    // dropped connection must fail the probe too.
    match tokio::time::timeout(timeout, client.get_capabilities(request)).await {
        Err(_) => false,
        Ok(Ok(_)) => true,
        Ok(Err(status)) => match status.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                false
            }
            tonic::Code::Unknown => std::error::Error::source(&status).is_none(),
            _ => true,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, unreachable: &[&str], draining: bool) -> MemberRecord {
        let names: Vec<String> = unreachable.iter().map(|p| p.to_string()).collect();
        MemberRecord {
            schema: 1,
            id: id.into(),
            address: String::new(),
            version: String::new(),
            lease: 1,
            admin_address: String::new(),
            admin_tls: false,
            draining,
            failing_providers: names.clone(),
            unreachable_providers: names,
            watches_peers: false,
            unwatched: false,
        }
    }

    fn ids(members: Vec<&MemberRecord>) -> Vec<&str> {
        members.iter().map(|m| m.id.as_str()).collect()
    }

    #[test]
    fn a_member_cut_off_from_a_provider_is_passed_over_while_another_reaches_it() {
        let members = [member("a", &["default"], false), member("b", &[], false)];
        assert_eq!(ids(preferable(&members)), ["b"]);
    }

    #[test]
    fn a_provider_no_member_reaches_passes_nobody_over() {
        let members = [
            member("a", &["default"], false),
            member("b", &["default"], false),
        ];
        assert_eq!(ids(preferable(&members)), ["a", "b"]);
    }

    #[test]
    fn a_member_whose_probes_only_began_to_fail_counts_as_not_reaching() {
        let mut suspect = member("b", &[], false);
        suspect.failing_providers = vec!["default".into()];
        let members = [member("a", &["default"], false), suspect];
        assert_eq!(ids(preferable(&members)), ["a", "b"]);
    }

    /// Probes of one provider, a second apart, from `start`: `true` reached.
    fn published(outcomes: &[bool]) -> ProviderReach {
        let (start, period) = (Instant::now(), Duration::from_secs(1));
        let mut probes = Probes::default();
        for (i, reached) in outcomes.iter().enumerate() {
            probes.note(*reached, start + period * i as u32, period);
        }
        let probes = HashMap::from([("p".to_string(), probes)]);
        reach(&probes, period, Duration::from_secs(4))
    }

    #[test]
    fn one_failed_probe_publishes_nothing_two_in_a_row_publish_failing() {
        assert_eq!(published(&[true, false]), ProviderReach::default());
        assert_eq!(published(&[true, false, true]), ProviderReach::default());
        assert_eq!(published(&[false, false]).failing, ["p"]);
        assert!(published(&[false, false]).unreachable.is_empty());
        assert_eq!(published(&[false; 5]).unreachable, ["p"]);
    }

    #[test]
    fn a_provider_is_reached_again_only_after_a_run_of_successes() {
        let mut outcomes = vec![false; 5];
        outcomes.push(true);
        assert_eq!(
            published(&outcomes).unreachable,
            ["p"],
            "one success amid failures"
        );
        outcomes.extend([true, false, true]);
        assert_eq!(published(&outcomes).unreachable, ["p"], "the run broke");
        outcomes.extend([true; RECOVERY_RUN as usize]);
        assert_eq!(published(&outcomes), ProviderReach::default());
    }

    #[test]
    fn a_draining_member_that_reaches_everything_does_not_count() {
        let members = [member("a", &["default"], false), member("b", &[], true)];
        assert_eq!(ids(preferable(&members)), ["a"]);
    }
}
