//! The tower layer that runs [`Authenticator::identify`] before any
//! service sees a request; a refused call is answered with its gRPC status
//! (at once, or once the message of a request that changes something is
//! read, up to [`TARGET_READ_LIMIT`] and [`TARGET_READ_TIMEOUT`]). For a
//! request that changes something, a refusal is written to the audit log
//! here, with the cluster or rollout its message names, and an allowed
//! request carries a [`RequestAudit`] to its handler.

use super::{changes_something, Authenticator};
use crate::audit::{AuditLog, Entry, Outcome, RequestAudit};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::codegen::http::{Extensions, Request, Response};
use tonic::codegen::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// The most of a refused request's message read for its target: a name
/// comes first, and a request that changes something is small.
const TARGET_READ_LIMIT: usize = 64 * 1024;
/// How long a refused request's message is waited for: a client that
/// sends none gets its refusal, without a target in the audit line.
const TARGET_READ_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct AuthLayer {
    auth: Arc<Authenticator>,
    audit: Arc<AuditLog>,
}

impl AuthLayer {
    pub fn new(auth: Arc<Authenticator>, audit: Arc<AuditLog>) -> Self {
        Self { auth, audit }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Authorized<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Authorized {
            inner,
            auth: Arc::clone(&self.auth),
            audit: Arc::clone(&self.audit),
        }
    }
}

/// A service behind the authenticator.
#[derive(Clone)]
pub struct Authorized<S> {
    inner: S,
    auth: Arc<Authenticator>,
    audit: Arc<AuditLog>,
}

impl<S, B> tower::Service<Request<B>> for Authorized<S>
where
    S: tower::Service<Request<B>, Response = Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let refused = |status: tonic::Status| -> Self::Future {
            Box::pin(std::future::ready(Ok(status.into_http())))
        };
        if !changes_something(request.uri().path()) {
            return match self.auth.check(request.uri().path(), request.headers()) {
                Ok(()) => Box::pin(self.inner.call(request)),
                Err(status) => refused(status),
            };
        }
        let method = request.uri().path().to_string();
        let subject = peer_subject(request.extensions());
        let (caller, verdict) = self.auth.identify(&method, request.headers(), subject);
        match verdict {
            Ok(()) => {
                let log = Arc::clone(&self.audit);
                let audit = RequestAudit {
                    log,
                    caller,
                    method,
                };
                request.extensions_mut().insert(audit);
                Box::pin(self.inner.call(request))
            }
            Err(status) => {
                let audit = Arc::clone(&self.audit);
                Box::pin(async move {
                    let target = refused_target(request.into_body()).await;
                    let rollout = method.starts_with("/drover.v1.Rollouts/");
                    audit.write(&Entry {
                        caller: &caller,
                        method: &method,
                        cluster: target.as_deref().filter(|_| !rollout),
                        rollout: target.as_deref().filter(|_| rollout),
                        request_id: "",
                        outcome: Outcome::refused(&status),
                    });
                    Ok(status.into_http())
                })
            }
        }
    }
}

/// Field 1 of every drover.v1 request that changes something: the name of
/// its cluster or rollout (a unit test checks the contract for it).
#[derive(Clone, PartialEq, prost::Message)]
struct Target {
    #[prost(string, tag = "1")]
    name: String,
}

/// The cluster or rollout a refused request names, read from its first
/// gRPC message; `None` when it is compressed, too large, too slow or
/// does not decode.
async fn refused_target<B>(body: B) -> Option<String>
where
    B: Body,
    B::Error: Into<tonic::codegen::StdError>,
{
    use http_body_util::{BodyExt, Limited};
    let read = Limited::new(body, TARGET_READ_LIMIT).collect();
    let bytes = tokio::time::timeout(TARGET_READ_TIMEOUT, read)
        .await
        .ok()?
        .ok()?
        .to_bytes();
    // A gRPC frame: a compression flag (0: none), a big-endian length,
    // the message.
    let (&[0, a, b, c, d], rest) = bytes.split_first_chunk::<5>()? else {
        return None;
    };
    let message = rest.get(..u32::from_be_bytes([a, b, c, d]) as usize)?;
    let name = <Target as prost::Message>::decode(message).ok()?.name;
    Some(name).filter(|name| !name.is_empty())
}

/// The subject of the client certificate the connection presented
/// (mutual TLS), if any.
fn peer_subject(extensions: &Extensions) -> Option<String> {
    let certificates = extensions
        .get::<TlsConnectInfo<TcpConnectInfo>>()?
        .peer_certs()?;
    super::certificate_subject(certificates.first()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use prost_types::field_descriptor_proto::Type;
    use std::collections::HashMap;

    /// What [`Target`] reads holds for every request that changes
    /// something in the contract.
    #[test]
    fn every_change_names_its_cluster_or_rollout_in_field_1() {
        let set = prost_types::FileDescriptorSet::decode(drover_proto::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let files: Vec<_> = set
            .file
            .iter()
            .filter(|f| f.package() == "drover.v1")
            .collect();
        let messages: HashMap<String, _> = files
            .iter()
            .flat_map(|f| {
                f.message_type
                    .iter()
                    .map(|m| (format!(".drover.v1.{}", m.name()), m))
            })
            .collect();
        let mut checked = 0;
        for service in files.iter().flat_map(|f| &f.service) {
            for method in &service.method {
                let path = format!("/drover.v1.{}/{}", service.name(), method.name());
                if !changes_something(&path) {
                    continue;
                }
                let first = messages[method.input_type()]
                    .field
                    .iter()
                    .find(|f| f.number() == 1);
                let named = first.is_some_and(|f| {
                    matches!(f.name(), "name" | "cluster") && f.r#type() == Type::String
                });
                assert!(named, "{path}: field 1 is not the name of its target");
                checked += 1;
            }
        }
        assert!(checked >= 19, "only {checked} changes");
    }

    #[tokio::test]
    async fn a_refused_message_names_its_target_unless_compressed() {
        let message = drover_proto::v1::StopClusterRequest {
            name: "web".into(),
            request_id: "stop-1".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let frame = |flag: u8| {
            let mut frame = vec![flag];
            frame.extend((message.len() as u32).to_be_bytes());
            frame.extend(&message);
            http_body_util::Full::new(std::io::Cursor::new(frame))
        };
        assert_eq!(refused_target(frame(0)).await.as_deref(), Some("web"));
        assert_eq!(refused_target(frame(1)).await, None);
    }
}
