//! A real etcd process for tests: loopback only, free ports, a temporary
//! data directory, killed (by its pid, which we started) on drop.

use crate::{free_port, wait_until, TempDir};
use drover_server::store::{EtcdOptions, EtcdStore, Store};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One single-member etcd cluster.
pub struct EtcdProcess {
    child: Option<Child>,
    data_dir: TempDir,
    client_port: u16,
    peer_port: u16,
}

impl EtcdProcess {
    /// Starts etcd and waits until it answers.
    pub async fn start() -> Self {
        let mut etcd = Self {
            child: None,
            data_dir: TempDir::new("etcd"),
            client_port: free_port(),
            peer_port: free_port(),
        };
        etcd.spawn().await;
        etcd
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A store connected to this etcd.
    pub async fn store(&self) -> EtcdStore {
        EtcdStore::connect(&EtcdOptions::new(vec![self.endpoint()]))
            .await
            .expect("connect to test etcd")
    }

    /// Kills etcd (SIGKILL) and waits for it to exit; the data stays.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    async fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::File::create(self.data_dir.path().join("etcd.log")).expect("etcd log");
        let child = Command::new("etcd")
            .args(["--name", "test"])
            .arg("--data-dir")
            .arg(self.data_dir.path().join("data"))
            .args(["--listen-client-urls", &self.endpoint()])
            .args(["--advertise-client-urls", &self.endpoint()])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("test={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (apt-get install etcd-server)");
        self.child = Some(child);
        let endpoint = self.endpoint();
        wait_until(Duration::from_secs(20), "etcd to answer", || {
            let endpoint = endpoint.clone();
            async move {
                match EtcdStore::connect(&EtcdOptions::new(vec![endpoint])).await {
                    Ok(store) => store.get("/health-probe").await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
