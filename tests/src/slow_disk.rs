//! A slow disk for etcd: a file system on a loop device whose writes are
//! throttled, for etcd alone, by a cgroup v1 blkio throttle
//! (`blkio.throttle.write_iops_device`).
//!
//! Guarantees: only the processes started in the cgroup (etcd) are slowed,
//! and only on the loop device; everything else on the machine writes at
//! full speed. Every piece is undone on drop, also when a test panics:
//! etcd killed (its pid, which we started), the file system unmounted, the
//! loop device detached, the cgroup removed, the image deleted.
//!
//! Assumptions: root, a cgroup v1 blkio hierarchy at
//! `/sys/fs/cgroup/blkio` with throttling (`CONFIG_BLK_DEV_THROTTLING`),
//! loop devices, `losetup`, `mkfs.ext4` and `mount`. Where one is missing,
//! [`SlowEtcd::start`] says which and returns `None` (the test skips).
//!
//! Caveats: cgroup v1 charges a write to the cgroup of the task that
//! submits it. etcd's WAL fdatasync writes its own dirty pages, so it is
//! throttled (measured: each fsync waits for the cgroup's next I/O slot);
//! writeback by the kernel's flusher threads and ext4's journal commits are
//! not, so the throttle bounds etcd's synchronous writes rather than every
//! byte it writes.

use crate::etcd::EtcdProcess;
use crate::scrape::{self, Histogram};
use crate::TempDir;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where cgroup v1 mounts the blkio controller.
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// The loop device's backing file: sparse, so only what etcd writes takes
/// space; enough for etcd's 64 MB WAL segments and its database.
const IMAGE_BYTES: u64 = 256 * 1024 * 1024;

/// A mounted file system on a loop device, and a blkio cgroup to throttle
/// writes to it.
pub struct SlowDisk {
    /// The loop device (`/dev/loopN`) once attached, and its `MAJ:MIN`.
    device: Option<(String, String)>,
    mounted: bool,
    cgroup: Option<PathBuf>,
    dir: TempDir,
}

impl SlowDisk {
    /// Makes the disk and the cgroup, not throttled yet; `None`, saying
    /// why, where the machine does not allow it.
    pub fn new() -> Option<Self> {
        let throttles = Path::new(BLKIO).join("blkio.throttle.write_iops_device");
        if !throttles.exists() {
            eprintln!(
                "SKIPPED: no cgroup v1 blkio throttling ({} is missing)",
                throttles.display()
            );
            return None;
        }
        let mut disk = Self {
            device: None,
            mounted: false,
            cgroup: None,
            dir: TempDir::new("slow-disk"),
        };
        match disk.set_up() {
            Ok(()) => Some(disk),
            Err(why) => {
                eprintln!("SKIPPED: no slow disk on this machine: {why}");
                None
            }
        }
    }

    fn set_up(&mut self) -> Result<(), String> {
        let image = self.dir.path().join("image");
        std::fs::File::create(&image)
            .and_then(|file| file.set_len(IMAGE_BYTES))
            .map_err(|error| format!("image file: {error}"))?;
        let device = run("losetup", &["--find", "--show", &image.to_string_lossy()])?;
        let name = device.trim_start_matches("/dev/").to_string();
        let number = std::fs::read_to_string(format!("/sys/block/{name}/dev"))
            .map_err(|error| format!("the number of {device}: {error}"))?;
        self.device = Some((device.clone(), number.trim().to_string()));
        run("mkfs.ext4", &["-q", &device])?;
        std::fs::create_dir(self.mount_point()).map_err(|error| error.to_string())?;
        run("mount", &[&device, &self.mount_point().to_string_lossy()])?;
        self.mounted = true;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let cgroup = Path::new(BLKIO).join(format!("drover-slow-{}-{n}", std::process::id()));
        std::fs::create_dir(&cgroup)
            .map_err(|error| format!("blkio cgroup {}: {error}", cgroup.display()))?;
        self.cgroup = Some(cgroup);
        Ok(())
    }

    /// The mounted file system's root.
    pub fn mount_point(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }

    /// The cgroup's `cgroup.procs`: a process that writes its pid there is
    /// throttled from then on.
    pub fn cgroup_procs(&self) -> PathBuf {
        self.cgroup().join("cgroup.procs")
    }

    fn cgroup(&self) -> &Path {
        self.cgroup.as_deref().expect("set up")
    }

    /// Limits the cgroup's writes to the disk to `iops` a second; 0 lifts
    /// the limit.
    pub fn throttle_writes(&self, iops: u32) {
        let (_, number) = self.device.as_ref().expect("set up");
        let file = self.cgroup().join("blkio.throttle.write_iops_device");
        std::fs::write(&file, format!("{number} {iops}"))
            .unwrap_or_else(|error| panic!("write {}: {error}", file.display()));
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        // Each step undoes one of `set_up`'s, latest first; a step that
        // fails is reported and the others still run.
        let report = |result: Result<String, String>| {
            if let Err(why) = result {
                eprintln!("slow disk clean-up: {why}");
            }
        };
        if self.mounted {
            report(run("umount", &[&self.mount_point().to_string_lossy()]));
        }
        if let Some((device, _)) = &self.device {
            report(run("losetup", &["-d", device]));
        }
        if let Some(cgroup) = &self.cgroup {
            report(
                std::fs::remove_dir(cgroup)
                    .map(|()| String::new())
                    .map_err(|error| format!("remove {}: {error}", cgroup.display())),
            );
        }
    }
}

/// Runs a tool to its end: its standard output, trimmed, or why it failed.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|error| format!("{program}: {error}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{program} {args:?}: {}: {}",
            output.status,
            stderr.trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// An etcd whose data is on a [`SlowDisk`], in its cgroup. Fields drop in
/// order: etcd (killed) before its disk is taken away.
pub struct SlowEtcd {
    pub etcd: EtcdProcess,
    pub disk: SlowDisk,
}

impl SlowEtcd {
    /// Starts etcd on a new slow disk, not throttled yet; `None` where the
    /// machine does not allow a slow disk.
    pub async fn start() -> Option<Self> {
        let disk = SlowDisk::new()?;
        let data = disk.mount_point().join("etcd");
        let etcd = EtcdProcess::start_in_cgroup(data, disk.cgroup_procs()).await;
        Some(Self { etcd, disk })
    }

    /// etcd's WAL fsync latencies so far (`etcd_disk_wal_fsync_duration_seconds`).
    pub async fn wal_fsyncs(&self) -> Histogram {
        let samples = scrape::metrics(&self.etcd.endpoint()).await;
        Histogram::of(&samples, "etcd_disk_wal_fsync_duration_seconds")
    }
}
