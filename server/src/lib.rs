//! The Drover replica.
pub mod store;
