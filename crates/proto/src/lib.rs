//! The toolmesh gRPC API v1 (`proto/toolmesh/v1`): generated messages, client and server,
//! the encoded descriptor set for server reflection, the server's [`ServerCodec`] (a
//! malformed request is `INVALID_ARGUMENT`), and [`status_code`], the one map from
//! toolmesh's [`ErrorCode`] to gRPC status codes.

use toolmesh_core::ErrorCode;

/// Generated code of package `toolmesh.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("toolmesh.v1");
    include!(concat!(env!("OUT_DIR"), "/client/toolmesh.v1.rs"));
}

mod codec;

pub use codec::{RequestDecoder, ServerCodec};

/// The encoded `FileDescriptorSet` of the API, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("toolmesh_descriptor");

/// The fully qualified name of the tool service, as health checking and reflection use it.
pub const TOOL_SERVICE_NAME: &str = "toolmesh.v1.ToolService";

/// Returns the gRPC status code for a toolmesh error code.
pub fn status_code(code: ErrorCode) -> tonic::Code {
    match code {
        ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorCode::NotFound => tonic::Code::NotFound,
        ErrorCode::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorCode::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorCode::Cancelled => tonic::Code::Cancelled,
        ErrorCode::Unavailable => tonic::Code::Unavailable,
        ErrorCode::Internal => tonic::Code::Internal,
    }
}
