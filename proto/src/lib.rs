//! The Drover gRPC contract.
//!
//! - [`v1`]: the public API (`drover.v1`): Clusters, Operations, Tasks, Admin.
//! - [`provider::v1`]: the provider plugin API (`drover.provider.v1`).
//! - [`FILE_DESCRIPTOR_SET`]: every file above, for gRPC server reflection.

/// The public API, package `drover.v1`.
pub mod v1 {
    tonic::include_proto!("drover.v1");
}

/// The provider plugin API.
pub mod provider {
    /// Package `drover.provider.v1`.
    pub mod v1 {
        tonic::include_proto!("drover.provider.v1");
    }
}

/// Encoded `FileDescriptorSet` of all Drover protos, for reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("drover_descriptor");
