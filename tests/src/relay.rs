//! A TCP relay that adds latency, for tests whose kernel cannot (no
//! `sch_netem`): clients connect to the relay, which connects to the
//! upstream address and pipes bytes both ways, holding each chunk it reads
//! for a delay drawn uniformly from a range before writing it on.
//!
//! Guarantees: bytes arrive complete and in order, each direction on its
//! own: a chunk read at `t` with a drawn delay `d` is written at
//! `max(t + d, when the chunk before it was written)`, so a long draw holds
//! the chunks behind it but never reorders them. Reads are never
//! throttled: this is latency, not a bandwidth limit. A half-close (EOF) is
//! passed on once the chunks before it are written; a broken side closes
//! both. When the [`Relay`] drops it stops accepting and closes every
//! connection it relays.
//!
//! Assumptions: it runs in the test process's tokio runtime (spawned
//! there), which must outlive nothing but the relay itself. Delays come
//! from [`crate::Lcg`] seeded by the caller, so a seed names a sequence of
//! draws.
//!
//! Caveats: latency is added per chunk read in user space, not per packet:
//! a chunk may hold several packets (held as one) and TCP's own timers
//! (retransmission, keep-alive) see the two short legs, not the delayed
//! whole. Which connection draws which delay depends on the order the
//! runtime polls them in, so a seed replays the draws, not their
//! assignment. The kernel this suite runs on lacks `sch_netem`, which would
//! delay packets themselves.

use crate::Lcg;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

/// The size of one read: a chunk is at most this long.
const CHUNK: usize = 16 * 1024;

/// The delay range and the draws from it, shared by every connection.
struct Delays {
    range: RangeInclusive<Duration>,
    rng: Lcg,
}

impl Delays {
    fn draw(&mut self) -> Duration {
        let (low, high) = (*self.range.start(), *self.range.end());
        let span = high.saturating_sub(low).as_micros() as usize;
        low + Duration::from_micros(self.rng.next(span + 1) as u64)
    }
}

/// A running relay; stopped, its connections closed, on drop.
pub struct Relay {
    address: SocketAddr,
    delays: Arc<Mutex<Delays>>,
    accepting: JoinHandle<()>,
}

impl Relay {
    /// Listens on `listen` (port 0: any free one, see [`Self::address`])
    /// and relays every connection to `upstream`, each chunk held for a
    /// delay drawn from `delay`.
    pub async fn start(
        listen: SocketAddr,
        upstream: SocketAddr,
        delay: RangeInclusive<Duration>,
        seed: u64,
    ) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(listen).await?;
        let address = listener.local_addr()?;
        let delays = Arc::new(Mutex::new(Delays {
            range: delay,
            rng: Lcg(seed),
        }));
        let accepting = tokio::spawn(accept(listener, upstream, delays.clone()));
        Ok(Relay {
            address,
            delays,
            accepting,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Changes the delay of every chunk read from now on, on every
    /// connection (chunks already held keep theirs).
    pub fn set_delay(&self, delay: RangeInclusive<Duration>) {
        self.delays.lock().expect("delays").range = delay;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The accepting task owns the connections' tasks (a JoinSet), which
        // abort, closing their sockets, when it does.
        self.accepting.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, delays: Arc<Mutex<Delays>>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                // A failed accept (a client gone before it was taken) ends
                // only that connection.
                if let Ok((client, _)) = accepted {
                    connections.spawn(relay(client, upstream, delays.clone()));
                }
            }
            // Reaps ended connections so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Pipes one connection both ways until both sides closed or one broke.
async fn relay(client: TcpStream, upstream: SocketAddr, delays: Arc<Mutex<Delays>>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        // Upstream refused: the client sees its connection closed, as it
        // would see the refusal had it connected directly.
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    // The first error drops both directions, closing both sockets.
    let _ = tokio::try_join!(
        pipe(client_read, server_write, &delays),
        pipe(server_read, client_write, &delays),
    );
}

/// One direction: reads as fast as `from` gives, writes each chunk at its
/// due time; `None` on the queue is the EOF, passed on as a shutdown.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delays: &Mutex<Delays>,
) -> std::io::Result<()> {
    let (queue, mut held) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let read = async move {
        let mut last_due = Instant::now();
        let mut buffer = vec![0; CHUNK];
        loop {
            let n = from.read(&mut buffer).await?;
            let delay = delays.lock().expect("delays").draw();
            last_due = last_due.max(Instant::now() + delay);
            let chunk = (n > 0).then(|| buffer[..n].to_vec());
            // The writer is gone only after an error, which ends the pair.
            let _ = queue.send((last_due, chunk));
            if n == 0 {
                return Ok::<_, std::io::Error>(());
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = held.recv().await {
            tokio::time::sleep_until(due).await;
            match chunk {
                Some(bytes) => to.write_all(&bytes).await?,
                None => return to.shutdown().await,
            }
        }
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An upstream that echoes what it reads, on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn chunks_arrive_whole_in_order_and_late() {
        let delay = Duration::from_millis(30)..=Duration::from_millis(60);
        let listen = "127.0.0.1:0".parse().unwrap();
        let relay = Relay::start(listen, echo().await, delay, 7).await.unwrap();
        let mut stream = TcpStream::connect(relay.address()).await.unwrap();
        let sent: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let started = Instant::now();
        // Written in pieces, so that each direction holds several chunks
        // with delays of their own.
        for piece in sent.chunks(1000) {
            stream.write_all(piece).await.unwrap();
        }
        let mut echoed = vec![0; sent.len()];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut echoed));
        read.await.expect("echoed within 10 s").unwrap();
        assert_eq!(echoed, sent);
        // Through the relay twice: at least the shortest delay each way.
        assert!(started.elapsed() >= Duration::from_millis(60));
    }

    #[tokio::test]
    async fn a_dropped_relay_closes_its_connections() {
        let listen = "127.0.0.1:0".parse().unwrap();
        let relay = Relay::start(listen, echo().await, Duration::ZERO..=Duration::ZERO, 1)
            .await
            .unwrap();
        let address = relay.address();
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(b"ping").await.unwrap();
        let mut pong = [0; 4];
        stream.read_exact(&mut pong).await.unwrap();
        drop(relay);
        let mut rest = [0; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut rest));
        let closed = read.await.expect("closed within 5 s");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
        assert!(
            TcpStream::connect(address).await.is_err(),
            "still accepting"
        );
    }
}
