//! Accepting connections, for the replica's gRPC server, its admin port
//! and the simulated provider alike.
//!
//! A leaf: it imports nothing from the crate, so the provider module does
//! not depend on the server that assembles the replica.
//!
//! # Guarantees
//! - An accept that fails because the process or the system is out of
//!   descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is not tried
//!   again at once: the loop waits, 10 ms doubling to 1 s, so a replica at
//!   its descriptor limit does not spin on a core; it accepts again as
//!   soon as a wait ends with descriptors free.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};

/// The first wait after an accept failed for want of resources.
const FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait between two accepts while resources stay exhausted.
const MAX_WAIT: Duration = Duration::from_secs(1);

/// The waits of an accept loop while resources are exhausted.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    /// The waits since resources ran out; `None` while they have not.
    waits: Option<backon::ExponentialBackoff>,
}

impl AcceptBackoff {
    /// After a failed accept: how long to wait before the next one, when
    /// the failure is for want of resources (another failure, such as a
    /// connection reset before it was accepted, concerns that connection
    /// alone: no wait).
    pub fn after(&mut self, error: &std::io::Error) -> Option<Duration> {
        if !exhausted(error) {
            return None;
        }
        let waits = self.waits.get_or_insert_with(|| {
            tracing::warn!(%error, "cannot accept connections: out of resources; waiting before the next accept");
            crate::retry::doubling(FIRST_WAIT, MAX_WAIT)
        });
        Some(waits.next().unwrap_or(MAX_WAIT))
    }

    /// After an accept that worked.
    pub fn reset(&mut self) {
        self.waits = None;
    }
}

/// Whether an accept failed for want of descriptors or memory.
fn exhausted(error: &std::io::Error) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(
        error.raw_os_error(),
        Some(EMFILE | ENFILE | ENOBUFS | ENOMEM)
    )
}

/// Accepted connections with Nagle's algorithm off (gRPC's small frames
/// would otherwise wait for delayed ACKs, tens of milliseconds per hop),
/// waiting as [`AcceptBackoff`] says while resources are exhausted.
pub fn incoming(listener: TcpListener) -> Incoming {
    Incoming {
        listener,
        backoff: AcceptBackoff::default(),
        waiting: None,
    }
}

/// The stream [`incoming`] returns; dropping it closes the listener.
pub struct Incoming {
    listener: TcpListener,
    backoff: AcceptBackoff,
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl tokio_stream::Stream for Incoming {
    type Item = std::io::Result<TcpStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(waiting) = self.waiting.as_mut() {
                std::task::ready!(waiting.as_mut().poll(cx));
                self.waiting = None;
            }
            match std::task::ready!(self.listener.poll_accept(cx)) {
                Ok((stream, _)) => {
                    self.backoff.reset();
                    return Poll::Ready(Some(stream.set_nodelay(true).map(|()| stream)));
                }
                Err(error) => match self.backoff.after(&error) {
                    Some(wait) => self.waiting = Some(Box::pin(tokio::time::sleep(wait))),
                    None => return Poll::Ready(Some(Err(error))),
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exhausted_resources_wait_and_the_waits_double_to_a_second() {
        let mut backoff = AcceptBackoff::default();
        let emfile = std::io::Error::from_raw_os_error(24);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionAborted);
        assert_eq!(backoff.after(&reset), None);
        let waits: Vec<_> = (0..9).map(|_| backoff.after(&emfile).unwrap()).collect();
        assert_eq!(waits[0], FIRST_WAIT);
        assert_eq!(waits[1], FIRST_WAIT * 2);
        assert_eq!(*waits.last().unwrap(), MAX_WAIT);
        backoff.reset();
        assert_eq!(backoff.after(&emfile), Some(FIRST_WAIT));
    }
}
