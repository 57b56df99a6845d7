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
//! - [`Net::lose`] / [`Net::stop_losing`]: random packet loss, a percentage
//!   of the packets a node sends to and receives from one address (and
//!   port), dropped by an nftables rule in the node's namespace.
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
//! Caveats: the kernel this suite is run on lacks `sch_netem`, so loss is
//! made with nftables (`numgen random`; needs the `nft` tool and the
//! kernel's nf_tables, see [`Net::nft_available`]) and delay in user space
//! by a relay (`crate::relay`) the nodes connect through; cuts need nothing
//! beyond veth and bridge. Processes started in a node are the caller's to
//! kill; the net only removes the namespaces (and the loss rules with them).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every namespace, bridge and veth this module makes starts with this.
const PREFIX: &str = "drvn";

/// A hardware address no interface has: frames sent to it are lost.
const NOWHERE: &str = "02:00:5e:00:de:ad";

/// The nftables table holding a node's loss rules, in its namespace.
const LOSS_TABLE: &str = "drover_loss";
/// The nftables table of [`Net::reject`], in a node's namespace.
const REJECT_TABLE: &str = "drover_reject";

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

    /// Whether nftables can drop packets at random here (the `nft` tool,
    /// nf_tables and its `numgen` expression in the kernel): a rule is
    /// loaded and removed again in the first node's namespace.
    pub fn nft_available(&self) -> bool {
        let at = &self.nodes[0].netns;
        let probe = format!(
            "table inet {LOSS_TABLE}probe {{ chain output {{ type filter hook output \
             priority 0; policy accept; ip daddr 127.0.0.2 numgen random mod 100 < 1 drop; }}; }}"
        );
        let loaded = nft(at, &probe);
        let _ = unload(at, &format!("{LOSS_TABLE}probe"));
        if let Err(why) = &loaded {
            eprintln!("nftables cannot drop packets here: {why}");
        }
        loaded.is_ok()
    }

    /// Drops `percent` of the packets between `node` and `peer_ip` (only
    /// those to and from `peer_port`, if given), each packet drawn on its
    /// own, both directions, in `node`'s namespace. Replaces an earlier
    /// loss of `node`.
    pub fn lose(&self, node: &str, peer_ip: &str, peer_port: Option<u16>, percent: u8) {
        assert!(percent <= 100, "a loss of {percent} %");
        let at = &self.node(node).netns;
        let (to_port, from_port) = match peer_port {
            Some(port) => (format!("tcp dport {port}"), format!("tcp sport {port}")),
            None => (String::new(), String::new()),
        };
        // Counted, so that a test can show the loss happened (`Self::dropped`).
        let drop = format!("numgen random mod 100 < {percent} counter drop");
        // Deleting the table first (when there is one) makes this a
        // replacement; `nft -f` applies the whole file atomically.
        let _ = unload(at, LOSS_TABLE);
        let rules = format!(
            "table inet {LOSS_TABLE} {{\n\
             chain input {{ type filter hook input priority 0; policy accept; \
             ip saddr {peer_ip} {from_port} {drop}; }}\n\
             chain output {{ type filter hook output priority 0; policy accept; \
             ip daddr {peer_ip} {to_port} {drop}; }}\n}}\n"
        );
        nft(at, &rules).unwrap_or_else(|why| panic!("loss at {node}: {why}"));
    }

    /// How many packets the loss of `node` (see [`Self::lose`]) dropped so
    /// far, both directions.
    pub fn dropped(&self, node: &str) -> u64 {
        let at = &self.node(node).netns;
        let rules = sh(&[
            "ip", "netns", "exec", at, "nft", "list", "table", "inet", LOSS_TABLE,
        ])
        .unwrap_or_else(|why| panic!("read the loss at {node}: {why}"));
        // Each rule reads `... counter packets N bytes M drop`.
        let words: Vec<_> = rules.split_whitespace().collect();
        words
            .windows(2)
            .filter(|pair| pair[0] == "packets")
            .map(|pair| pair[1].parse::<u64>().expect("a packet count"))
            .sum()
    }

    /// Makes `node` refuse its own connections to each `(ip, port)` of
    /// `targets`: new and established ones get a TCP reset from its own
    /// stack (an egress `reject with tcp reset`), as a restarting local
    /// proxy or an egress REJECT rule would. Replaces an earlier rejection
    /// at `node`.
    pub fn reject(&self, node: &str, targets: &[(String, u16)]) {
        let at = &self.node(node).netns;
        let _ = unload(at, REJECT_TABLE);
        let rules: String = targets
            .iter()
            .map(|(ip, port)| {
                format!("ip daddr {ip} tcp dport {port} counter reject with tcp reset; ")
            })
            .collect();
        let table = format!(
            "table inet {REJECT_TABLE} {{\n\
             chain output {{ type filter hook output priority 0; policy accept; {rules}}}\n}}\n"
        );
        nft(at, &table).unwrap_or_else(|why| panic!("reject at {node}: {why}"));
    }

    /// Destroys `node`'s TCP connections to `peer_ip:peer_port` (`ss -K`),
    /// as a restarting proxy does to the connections through it.
    pub fn kill_connections(&self, node: &str, peer_ip: &str, peer_port: u16) {
        let at = &self.node(node).netns;
        let port = peer_port.to_string();
        sh(&[
            "ip", "netns", "exec", at, "ss", "-K", "dst", peer_ip, "dport", "=", &port,
        ])
        .unwrap_or_else(|why| panic!("kill the connections of {node}: {why}"));
    }

    /// Undoes [`Self::reject`].
    pub fn stop_rejecting(&self, node: &str) {
        let at = &self.node(node).netns;
        unload(at, REJECT_TABLE).unwrap_or_else(|why| panic!("end the rejection at {node}: {why}"));
    }

    /// Undoes [`Self::lose`].
    pub fn stop_losing(&self, node: &str) {
        let at = &self.node(node).netns;
        unload(at, LOSS_TABLE).unwrap_or_else(|why| panic!("end the loss at {node}: {why}"));
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

/// Deletes the nftables `table` of `netns`.
fn unload(netns: &str, table: &str) -> Result<String, String> {
    sh(&[
        "ip", "netns", "exec", netns, "nft", "delete", "table", "inet", table,
    ])
}

/// Loads `rules` (an nftables file) into `netns`, atomically.
fn nft(netns: &str, rules: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(rules.as_bytes())
        .map_err(|e| format!("nft: {e}"))?;
    drop(stdin);
    let output = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`nft -f -`: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
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
