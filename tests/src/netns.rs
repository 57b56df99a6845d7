//! A network of Linux network namespaces for partition tests: one
//! namespace per node (an etcd member, a replica, the provider), each with
//! a veth pair whose outer end is plugged into one bridge made for the test.
//! The bridge carries the first address of the subnet, so the test process
//! (in its own namespace) reaches every node like a client would.
//!
//! Faults between two nodes:
//! - [`Net::cut`] / [`Net::heal`]: each side gets a permanent neighbour
//!   entry giving the other's address a hardware address nobody has. Frames
//!   still leave, the bridge floods them, nobody takes them: a silent drop
//!   (no reset, no "unreachable"), as in a real partition, in both
//!   directions, touching no other pair.
//! - [`Net::isolate`] / [`Net::rejoin`]: the node's veth down, a cut from
//!   every other node and from the test process.
//!
//! Guarantees: every namespace and link is deleted when the [`Net`] drops,
//! a failed test included; namespaces left by a test process that was
//! killed (which runs no destructor) are deleted by the next one
//! ([`sweep`]). Only names with this module's prefix are touched, and only
//! addresses in a private /24 that no route of this machine uses.
//!
//! Assumptions: the test runs as root (CAP_NET_ADMIN, CAP_SYS_ADMIN for
//! `ip netns`) with `ip` (iproute2) installed. Where namespaces cannot be
//! made, [`Net::new`] says why and returns `None`: the test skips.
//!
//! Caveats: the kernel this suite is run on may lack `sch_netem` (delay,
//! loss): see [`Net::netem_available`]; cuts need nothing beyond veth and
//! bridge. Processes started in a node are the caller's to kill; the net
//! only removes the namespaces.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every namespace, bridge and veth this module makes starts with this.
const PREFIX: &str = "drvn";

/// A hardware address no interface has: frames sent to it are lost.
const NOWHERE: &str = "02:00:5e:00:de:ad";

/// Networks made by this test process so far (names and subnets).
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One node: its namespace and address.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub netns: String,
    pub ip: String,
}

impl Node {
    /// A command for `program` run inside this node's namespace (`ip netns
    /// exec` execs it in place, so the child's pid is the program's own).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns]).arg(program);
        command
    }
}

/// The namespaces, their veths and the bridge; deleted on drop.
pub struct Net {
    bridge: String,
    /// The host ends of the veths, by node index.
    links: Vec<String>,
    pub nodes: Vec<Node>,
    /// The address of the bridge, the test process's side.
    pub host_ip: String,
}

impl Net {
    /// Makes one namespace per name, all on one new bridge. `None` (after
    /// saying why) when this machine does not allow it.
    pub fn new(names: &[&str]) -> Option<Net> {
        if let Err(why) = sh(&["ip", "netns", "list"]) {
            eprintln!("SKIPPED: no network namespaces here ({why})");
            return None;
        }
        sweep();
        let serial = NEXT.fetch_add(1, Ordering::SeqCst);
        // Six hex digits of pid (Linux pids stay below 2^22) and two of
        // serial: names within the 15 bytes an interface name may have.
        let tag = format!("{:06x}{:02x}", std::process::id(), serial % 0x100);
        let subnet = free_subnet()?;
        let mut net = Net {
            bridge: format!("{PREFIX}b{tag}"),
            links: Vec::new(),
            nodes: Vec::new(),
            host_ip: format!("{subnet}.1"),
        };
        match net.build(names, &tag, &subnet) {
            Ok(()) => {}
            // Not allowed to make a bridge or a namespace: skip.
            Err(why) if net.nodes.is_empty() => {
                eprintln!("SKIPPED: could not build the test network ({why})");
                return None;
            }
            // Allowed, yet something went wrong: a fault of the harness.
            Err(why) => panic!("could not build the test network: {why}"),
        }
        Some(net)
    }

    fn build(&mut self, names: &[&str], tag: &str, subnet: &str) -> Result<(), String> {
        let bridge = self.bridge.clone();
        sh(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.host_ip),
            "dev",
            &bridge,
        ])?;
        sh(&["ip", "link", "set", &bridge, "up"])?;
        for (i, name) in names.iter().enumerate() {
            let netns = format!("{PREFIX}-{}-{tag}-{name}", std::process::id());
            let link = format!("{PREFIX}{tag}v{i}");
            sh(&["ip", "netns", "add", &netns])?;
            self.nodes.push(Node {
                name: name.to_string(),
                netns: netns.clone(),
                ip: format!("{subnet}.{}", i + 2),
            });
            sh(&[
                "ip", "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ])?;
            self.links.push(link.clone());
            sh(&["ip", "link", "set", &link, "master", &bridge, "up"])?;
            let ip = format!("{}/24", self.nodes[i].ip);
            sh(&["ip", "-n", &netns, "addr", "add", &ip, "dev", "eth0"])?;
            sh(&["ip", "-n", &netns, "link", "set", "eth0", "up"])?;
            sh(&["ip", "-n", &netns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Drops every packet between `a` and `b`, both ways, silently.
    pub fn cut(&self, a: &str, b: &str) {
        for (from, to) in [(self.node(a), self.node(b)), (self.node(b), self.node(a))] {
            let at = &from.netns;
            sh(&[
                "ip",
                "-n",
                at,
                "neigh",
                "replace",
                &to.ip,
                "lladdr",
                NOWHERE,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ])
            .unwrap_or_else(|why| panic!("cut {a} from {b}: {why}"));
        }
    }

    /// Undoes [`Self::cut`]: the next packet asks (ARP) for the real address.
    pub fn heal(&self, a: &str, b: &str) {
        for (from, to) in [(self.node(a), self.node(b)), (self.node(b), self.node(a))] {
            let at = &from.netns;
            sh(&["ip", "-n", at, "neigh", "del", &to.ip, "dev", "eth0"])
                .unwrap_or_else(|why| panic!("heal {a} and {b}: {why}"));
        }
    }

    /// Cuts `name` from every node and from the test process.
    pub fn isolate(&self, name: &str) {
        let link = &self.links[self.index(name)];
        sh(&["ip", "link", "set", link, "down"]).unwrap_or_else(|why| panic!("{why}"));
    }

    /// Undoes [`Self::isolate`].
    pub fn rejoin(&self, name: &str) {
        let link = &self.links[self.index(name)];
        sh(&["ip", "link", "set", link, "up"]).unwrap_or_else(|why| panic!("{why}"));
    }

    fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Whether the kernel has `sch_netem` (delay, loss, reordering).
    pub fn netem_available(&self) -> bool {
        let at = &self.nodes[0].netns;
        let added = sh(&[
            "ip", "netns", "exec", at, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
            "1ms",
        ]);
        let _ = sh(&[
            "ip", "netns", "exec", at, "tc", "qdisc", "del", "dev", "lo", "root",
        ]);
        added.is_ok()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end inside it, and with it
        // the host end; the bridge goes last.
        for node in &self.nodes {
            let _ = sh(&["ip", "netns", "del", &node.netns]);
        }
        for link in &self.links {
            let _ = sh(&["ip", "link", "del", link]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge]);
    }
}

/// Deletes what a killed test process (one no longer running) left: its
/// namespaces and bridges carry its pid (a veth goes with its namespace).
pub fn sweep() {
    let Ok(list) = sh(&["ip", "netns", "list"]) else {
        return;
    };
    for line in list.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(&format!("{PREFIX}-")) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh(&["ip", "netns", "del", name]);
        }
    }
    let Ok(links) = sh(&["ip", "-o", "link", "show", "type", "bridge"]) else {
        return;
    };
    for line in links.lines() {
        let Some(name) = line.split(':').nth(1).map(str::trim) else {
            continue;
        };
        let Some(tag) = name.strip_prefix(&format!("{PREFIX}b")) else {
            continue;
        };
        // The tag starts with the pid of the process that made it.
        let Some(pid) = tag.get(..6).and_then(|h| u32::from_str_radix(h, 16).ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = sh(&["ip", "link", "del", name]);
        }
    }
}

/// A 10.x.y.0/24 (as "10.x.y") that no address or route here is in.
fn free_subnet() -> Option<String> {
    let routes = sh(&["ip", "-4", "route", "show", "table", "all"]).unwrap_or_default();
    let addrs = sh(&["ip", "-4", "-o", "addr", "show"]).unwrap_or_default();
    let start = std::process::id() as usize * 31 + NEXT.load(Ordering::SeqCst) as usize;
    for i in 0..200 {
        let n = start + i * 7;
        let subnet = format!("10.{}.{}", 200 + n % 50, (n / 50) % 250);
        let prefix = format!("{subnet}.");
        if !routes.contains(&prefix) && !addrs.contains(&prefix) {
            return Some(subnet);
        }
    }
    eprintln!("SKIPPED: no free private /24 for the test network");
    None
}

/// Runs a command, its standard output on success, what went wrong if not.
fn sh(args: &[&str]) -> Result<String, String> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "`{}`: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
