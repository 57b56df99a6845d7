//! The Drover gRPC contract.
//!
//! - [`v1`]: the public API (`drover.v1`): Clusters, Operations, Tasks, Admin.
//! - [`provider::v1`]: the provider plugin API (`drover.provider.v1`), and
//!   [`provider::deadline`]: how a provider reads a call's deadline.
//! - [`FILE_DESCRIPTOR_SET`]: every file above, for gRPC server reflection.
//! - [`REASON_METADATA`]: the metadata key that tells apart errors sharing
//!   a status code.

/// The public API, package `drover.v1`.
pub mod v1 {
    tonic::include_proto!("drover.v1");
    include!(concat!(env!("OUT_DIR"), "/drover.v1.serde.rs"));
}

/// The provider plugin API.
pub mod provider {
    /// Package `drover.provider.v1`.
    pub mod v1 {
        tonic::include_proto!("drover.provider.v1");
        include!(concat!(env!("OUT_DIR"), "/drover.provider.v1.serde.rs"));
    }

    /// The deadline of a fenced call, as a provider reads it.
    pub mod deadline;
}

/// `google.protobuf.Timestamp` as the messages carry it: prost's, plus
/// serde to and from RFC 3339 text.
pub use pbjson_types::Timestamp;

/// Encoded `FileDescriptorSet` of all Drover protos, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("drover_descriptor");

/// Error metadata key whose value says which of the errors sharing a status
/// code this is, where a client must act differently.
pub const REASON_METADATA: &str = "drover-reason";

/// [`REASON_METADATA`] of the ABORTED answer to an update whose
/// `expected_generation` is not the cluster's: unlike a lost race, sending
/// the same request again cannot succeed (read the cluster again first).
pub const REASON_GENERATION_MISMATCH: &str = "generation-mismatch";
