//! What the kernel says of a process: its CPU time and resident memory,
//! for the benchmark's figures.

use std::time::Duration;

/// CPU time (user + system) process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    static TICKS_PER_SECOND: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let ticks_per_second = *TICKS_PER_SECOND.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100.0)
    });
    // Fields after the parenthesised command name: utime and stime are the
    // 12th and 13th (fields 14 and 15 of proc(5)).
    let ticks = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let fields: Vec<u64> = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|field| field.parse().ok())
                .collect();
            Some(fields.iter().sum::<u64>())
        })
        .unwrap_or(0);
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

/// Resident memory of process `pid`, KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// CPU time used so far (or over a span, or per unit of work), per role.
#[derive(Debug, Default, Clone, Copy)]
pub struct CpuTimes {
    /// Every etcd member, summed.
    pub etcd: Duration,
    /// Every replica, summed.
    pub replicas: Duration,
    pub provider: Duration,
    /// This process: the benchmark's clients (API calls in the Drover
    /// rounds, the CAS loop in the raw ones, a rollout's client).
    pub clients: Duration,
}

impl CpuTimes {
    /// What the processes `etcd`, `replicas` and `provider`, and this one,
    /// have used so far.
    pub fn of(etcd: &[u32], replicas: &[u32], provider: u32) -> Self {
        Self {
            etcd: etcd.iter().map(|pid| cpu_time(*pid)).sum(),
            replicas: replicas.iter().map(|pid| cpu_time(*pid)).sum(),
            provider: cpu_time(provider),
            clients: cpu_time(std::process::id()),
        }
    }

    pub fn since(&self, before: &Self) -> Self {
        Self {
            etcd: self.etcd.saturating_sub(before.etcd),
            replicas: self.replicas.saturating_sub(before.replicas),
            provider: self.provider.saturating_sub(before.provider),
            clients: self.clients.saturating_sub(before.clients),
        }
    }

    pub fn add(&mut self, other: &Self) {
        self.etcd += other.etcd;
        self.replicas += other.replicas;
        self.provider += other.provider;
        self.clients += other.clients;
    }

    pub fn per(&self, count: f64) -> Self {
        let count = count.max(1.0);
        Self {
            etcd: self.etcd.div_f64(count),
            replicas: self.replicas.div_f64(count),
            provider: self.provider.div_f64(count),
            clients: self.clients.div_f64(count),
        }
    }

    pub fn total(&self) -> Duration {
        self.etcd + self.replicas + self.provider + self.clients
    }
}
