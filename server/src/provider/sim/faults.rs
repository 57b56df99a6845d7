//! Seeded random faults of the simulated provider: per method, the
//! probability that a call fails, is slowed, hangs, does only part of its
//! work, or is admitted (its token checked) now and lands later.
//!
//! # Guarantees
//! - The same plan, seed and sequence of calls draw the same faults.
//! - An empty plan draws nothing: the simulator behaves as without one.
//!
//! # Caveats
//! - Calls arrive concurrently, so which call gets which draw depends on
//!   their order of arrival: a seed reproduces a run's mix of faults, not
//!   necessarily every fault at the same call.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::time::Duration;

/// The kinds of fault, by the name the plan gives them.
pub const KINDS: [&str; 5] = ["error", "latency", "hang", "partial", "late"];

/// How likely each fault is for one call, each in 0..=1.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultRates {
    /// Fails before doing anything (UNAVAILABLE).
    pub error: f64,
    /// Answers after an extra delay.
    pub latency: f64,
    /// Never answers (until the caller gives up).
    pub hang: f64,
    /// A call over several nodes does some of them, then fails.
    pub partial: f64,
    /// Checks the token on entry and applies its effect after a delay, even
    /// if the caller went away: a real provider's admitted call that lands
    /// later. A newer epoch accepted meanwhile ends it unapplied (the drain
    /// of drover.provider.v1).
    pub late: f64,
}

impl FaultRates {
    fn set(&mut self, kind: &str, p: f64) -> Result<(), FaultPlanError> {
        let slot = match kind {
            "error" => &mut self.error,
            "latency" => &mut self.latency,
            "hang" => &mut self.hang,
            "partial" => &mut self.partial,
            "late" => &mut self.late,
            other => return Err(FaultPlanError::Kind(other.to_string())),
        };
        *slot = p;
        Ok(())
    }
}

/// A malformed fault plan.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FaultPlanError {
    #[error("faults: {0:?} is not METHOD:KIND=P[,KIND=P...]")]
    Syntax(String),
    #[error("faults: unknown fault kind {0:?} (kinds: error, latency, hang, partial, late)")]
    Kind(String),
    #[error("faults: probability {0:?} is not a number in 0..=1")]
    Probability(String),
}

/// Fault rates per method; `*` holds those of every method not named.
///
/// Written `METHOD:KIND=P[,KIND=P...][;METHOD:...]`, e.g.
/// `UpgradeNode:error=0.1,late=0.2;*:latency=0.3`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    rates: HashMap<String, FaultRates>,
}

impl FaultPlan {
    /// The rates that apply to `method`.
    pub fn rates(&self, method: &str) -> FaultRates {
        self.rates
            .get(method)
            .or_else(|| self.rates.get("*"))
            .copied()
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.rates.values().all(|r| *r == FaultRates::default())
    }
}

impl FromStr for FaultPlan {
    type Err = FaultPlanError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut plan = FaultPlan::default();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (method, kinds) = entry
                .split_once(':')
                .filter(|(m, _)| !m.trim().is_empty())
                .ok_or_else(|| FaultPlanError::Syntax(entry.to_string()))?;
            let rates = plan.rates.entry(method.trim().to_string()).or_default();
            for pair in kinds.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (kind, p) = pair
                    .split_once('=')
                    .ok_or_else(|| FaultPlanError::Syntax(entry.to_string()))?;
                let p = p
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| FaultPlanError::Probability(p.trim().to_string()))?;
                rates.set(kind.trim(), p)?;
            }
        }
        Ok(plan)
    }
}

/// What one call draws.
#[derive(Debug, Default, Clone, Copy)]
pub struct Draw {
    pub error: bool,
    pub hang: bool,
    pub delay: Option<Duration>,
    pub partial: bool,
    pub late: Option<Duration>,
}

/// The plan with its seeded generator and the count of faults drawn.
#[derive(Debug, Default)]
pub struct Faults {
    plan: FaultPlan,
    max_delay: Duration,
    rng: SplitMix64,
    injected: BTreeMap<String, u64>,
}

impl Faults {
    pub fn configure(
        &mut self,
        plan: Option<FaultPlan>,
        seed: Option<u64>,
        max_delay: Option<Duration>,
    ) {
        if let Some(plan) = plan {
            self.plan = plan;
        }
        if let Some(seed) = seed {
            self.rng = SplitMix64(seed);
        }
        if let Some(max_delay) = max_delay {
            self.max_delay = max_delay;
        }
    }

    /// Draws the faults of one call of `method`; `partial` and `late` only
    /// where the call can have them. Counts what it drew.
    pub fn draw(&mut self, method: &str, can_be_partial: bool, can_land_late: bool) -> Draw {
        let rates = self.plan.rates(method);
        if rates == FaultRates::default() {
            return Draw::default();
        }
        let mut draw = Draw {
            error: self.chance(rates.error),
            ..Draw::default()
        };
        if !draw.error {
            draw.hang = self.chance(rates.hang);
        }
        if !draw.error && !draw.hang {
            draw.delay = self.chance(rates.latency).then(|| self.delay());
            draw.partial = can_be_partial && self.chance(rates.partial);
            draw.late = (can_land_late && self.chance(rates.late)).then(|| self.delay());
        }
        let drawn = [
            draw.error,
            draw.delay.is_some(),
            draw.hang,
            draw.partial,
            draw.late.is_some(),
        ];
        for (kind, drawn) in KINDS.iter().zip(drawn) {
            if drawn {
                *self.injected.entry(format!("{method}/{kind}")).or_default() += 1;
            }
        }
        draw
    }

    /// Faults drawn so far, by `Method/kind`.
    pub fn injected(&self) -> &BTreeMap<String, u64> {
        &self.injected
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.unit() < p
    }

    /// A delay between half of max_delay and all of it: long enough to
    /// matter every time it is drawn.
    fn delay(&mut self) -> Duration {
        let max = self.max_delay.as_millis().max(2) as u64;
        Duration::from_millis(max / 2 + self.rng.next() % (max - max / 2 + 1))
    }
}

/// A small, seedable generator (SplitMix64): enough for drawing faults.
#[derive(Debug, Default)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_names_rates_per_method_with_a_default() {
        let plan: FaultPlan = "UpgradeNode:error=0.1,late=0.2; *:latency=0.3"
            .parse()
            .unwrap();
        assert_eq!(plan.rates("UpgradeNode").error, 0.1);
        assert_eq!(plan.rates("UpgradeNode").late, 0.2);
        assert_eq!(plan.rates("UpgradeNode").latency, 0.0);
        assert_eq!(plan.rates("StopNodes").latency, 0.3);
        assert!("".parse::<FaultPlan>().unwrap().is_empty());
    }

    #[test]
    fn malformed_plans_name_what_is_wrong() {
        let parse = |s: &str| s.parse::<FaultPlan>().unwrap_err();
        assert_eq!(
            parse("error=0.1"),
            FaultPlanError::Syntax("error=0.1".into())
        );
        assert_eq!(parse("*:boom=0.1"), FaultPlanError::Kind("boom".into()));
        assert_eq!(parse("*:error=2"), FaultPlanError::Probability("2".into()));
    }

    #[test]
    fn the_same_seed_draws_the_same_faults() {
        let plan: FaultPlan = "*:error=0.3,hang=0.1,latency=0.5,partial=0.5,late=0.5"
            .parse()
            .unwrap();
        let run = |seed| {
            let mut faults = Faults::default();
            faults.configure(
                Some(plan.clone()),
                Some(seed),
                Some(Duration::from_millis(50)),
            );
            (0..200)
                .map(|_| format!("{:?}", faults.draw("StopNodes", true, true)))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut faults = Faults::default();
        faults.configure(Some(plan), Some(7), None);
        for _ in 0..200 {
            faults.draw("StopNodes", true, true);
        }
        let errors = faults.injected()["StopNodes/error"];
        assert!(
            (30..90).contains(&errors),
            "{errors} errors in 200 draws at 0.3"
        );
    }
}
