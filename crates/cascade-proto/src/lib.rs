//! The wire types of Cascade (generated from `proto/` by protox and
//! tonic-prost-build) and their conversion to and from the core model.
//!
//! Only this crate knows prost types; the node and the client convert at
//! this edge. Errors cross it as [`status_from_core`] (core error → gRPC
//! status with [`v1::ErrorDetails`]) and [`error_details`] (back).
//!
//! # Layout
//!
//! - [`v1`]: generated messages, clients and servers.
//! - [`convert`]: core ↔ wire conversions; request decoders name the bad field.
//! - [`status`]: the mapping of core error classes to `tonic::Code` and
//!   `ErrorDetails`.
//! - [`codec`]: the gRPC codec (INVALID_ARGUMENT for undecodable requests).
//! - [`page_token`]: the opaque page token of aggregated operation outcomes.

pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("cascade.v1");
}

pub mod codec;
pub mod convert;
pub mod page_token;
pub mod status;

pub use status::{error_details, status_from_core};

/// Encoded `FileDescriptorSet` of the API, for the gRPC reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cascade_descriptor.bin"));

/// Largest gRPC message a node or client accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
