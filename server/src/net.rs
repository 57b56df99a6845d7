//! Accepting gRPC connections, for the replica's server and the simulated
//! provider alike.
//!
//! A leaf: it imports nothing from the crate, so the provider module does
//! not depend on the server that assembles the replica.

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

/// Accepted connections with Nagle's algorithm off: gRPC's small frames
/// would otherwise wait for delayed ACKs (tens of milliseconds per hop).
pub fn incoming(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(listener).map(|accepted| {
        let stream = accepted?;
        stream.set_nodelay(true)?;
        Ok(stream)
    })
}
