//! The simulator's behaviour as command-line flags, shared by
//! `drover-sim-provider` and `drover dev` so both are tuned the same way by
//! hand: step and task latency, seeded random faults, and what it builds.
//! The Simulator control service (`Configure`) changes the same settings
//! while it runs.

use super::faults::FaultPlan;
use super::{Known, SimProvider};
use std::time::Duration;

/// How the simulated provider behaves; each flag also reads a
/// `DROVER_SIM_*` variable.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SimFlags {
    /// Delay of every mutating provider call (one step of an operation),
    /// in milliseconds.
    #[arg(long, env = "DROVER_SIM_STEP_LATENCY_MS", default_value_t = 0)]
    pub step_latency_ms: u64,
    /// How long a task run takes, in milliseconds.
    #[arg(long, env = "DROVER_SIM_TASK_LATENCY_MS", default_value_t = 0)]
    pub task_latency_ms: u64,
    /// Random faults per method, METHOD:KIND=P[,KIND=P...][;METHOD:...]
    /// with kinds error, latency, hang, partial, late and "*" for every
    /// method not named, e.g. "UpgradeNode:error=0.1,late=0.2;*:latency=0.3".
    /// None by default.
    #[arg(long, env = "DROVER_SIM_FAULTS", default_value = "")]
    pub faults: FaultPlan,
    /// Seed of the random faults: the same seed draws the same faults.
    #[arg(long, env = "DROVER_SIM_FAULT_SEED", default_value_t = 0)]
    pub fault_seed: u64,
    /// Upper bound of an injected delay (extra latency, late landing), in
    /// milliseconds.
    #[arg(long, env = "DROVER_SIM_FAULT_DELAY_MS", default_value_t = 200)]
    pub fault_delay_ms: u64,
    /// Versions it builds, comma-separated; ValidateSpec refuses others.
    /// Empty (the default): any.
    #[arg(long, env = "DROVER_SIM_VERSIONS", value_delimiter = ',')]
    pub versions: Vec<String>,
    /// Node offerings it builds, comma-separated; ValidateSpec refuses
    /// others. Empty (the default): any.
    #[arg(long, env = "DROVER_SIM_OFFERINGS", value_delimiter = ',')]
    pub offerings: Vec<String>,
}

impl SimFlags {
    /// A simulator behaving as the flags say.
    pub fn provider(self) -> SimProvider {
        let delay = Duration::from_millis(self.fault_delay_ms);
        let sim = SimProvider::with_faults(self.faults, self.fault_seed, delay).knowing(Known {
            versions: self.versions,
            offerings: self.offerings,
        });
        {
            let mut state = sim.lock();
            state.step_latency = Duration::from_millis(self.step_latency_ms);
            state.task_latency = Duration::from_millis(self.task_latency_ms);
        }
        sim
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        sim: SimFlags,
    }

    #[test]
    fn the_latency_flags_set_the_latencies() {
        let flags =
            Command::parse_from(["sim", "--step-latency-ms", "250", "--task-latency-ms", "40"]).sim;
        let state = flags.provider();
        let state = state.lock();
        assert_eq!(state.step_latency, Duration::from_millis(250));
        assert_eq!(state.task_latency, Duration::from_millis(40));
    }

    #[test]
    fn a_bad_fault_plan_is_a_usage_error() {
        assert!(Command::try_parse_from(["sim", "--faults", "UpgradeNode:error=2"]).is_err());
    }
}
