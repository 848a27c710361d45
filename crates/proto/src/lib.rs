//! The toolmesh gRPC API v1 (`proto/toolmesh/v1`): generated messages, client and server,
//! the encoded descriptor set for server reflection, the server's [`ServerCodec`] (a
//! malformed request is `INVALID_ARGUMENT`), and [`status_code`], the one map from
//! toolmesh's [`ErrorCode`] to gRPC status codes.

use toolmesh_core::{CallFailure, ErrorCode, FailureDetail, clip};

/// Generated code of package `toolmesh.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("toolmesh.v1");
    include!(concat!(env!("OUT_DIR"), "/client/toolmesh.v1.rs"));
}

mod codec;
pub mod convert;

pub use codec::{RequestDecoder, ServerCodec};

/// The encoded `FileDescriptorSet` of the API, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("toolmesh_descriptor");

/// The fully qualified name of the tool service, as health checking and reflection use it.
pub const TOOL_SERVICE_NAME: &str = "toolmesh.v1.ToolService";

/// Characters of a status message; the rest is cut (`…`): it travels in a header.
const STATUS_CHARS: usize = 1024;

/// Returns the gRPC status of `failure`, its details as `google.rpc` details; the one place
/// statuses are built from toolmesh's errors.
pub fn status(failure: &CallFailure) -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let code = status_code(failure.code);
    let message = clip(&failure.message, STATUS_CHARS).into_owned();
    match &failure.detail {
        FailureDetail::None => tonic::Status::new(code, message),
        FailureDetail::BadRequest(violations) => {
            let fields = violations
                .iter()
                .map(|v| {
                    tonic_types::FieldViolation::new(
                        clip(&v.field, STATUS_CHARS / 4),
                        clip(&v.description, STATUS_CHARS / 4),
                    )
                })
                .collect::<Vec<_>>();
            tonic::Status::with_error_details(code, message, ErrorDetails::with_bad_request(fields))
        }
        FailureDetail::Info { reason, metadata } => {
            let metadata: std::collections::HashMap<String, String> =
                metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            tonic::Status::with_error_details(
                code,
                message,
                ErrorDetails::with_error_info(*reason, "toolmesh", metadata),
            )
        }
        FailureDetail::RetryAfter { delay, reason, metadata } => {
            let metadata: std::collections::HashMap<String, String> =
                metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            let mut details = ErrorDetails::with_retry_info(Some(*delay));
            details.set_error_info(*reason, "toolmesh", metadata);
            tonic::Status::with_error_details(code, message, details)
        }
    }
}

/// Returns the gRPC status code for a toolmesh error code.
pub fn status_code(code: ErrorCode) -> tonic::Code {
    match code {
        ErrorCode::InvalidArgument => tonic::Code::InvalidArgument,
        ErrorCode::NotFound => tonic::Code::NotFound,
        ErrorCode::FailedPrecondition => tonic::Code::FailedPrecondition,
        ErrorCode::PermissionDenied => tonic::Code::PermissionDenied,
        ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
        ErrorCode::ResourceExhausted => tonic::Code::ResourceExhausted,
        ErrorCode::Cancelled => tonic::Code::Cancelled,
        ErrorCode::Unavailable => tonic::Code::Unavailable,
        ErrorCode::Internal => tonic::Code::Internal,
    }
}
