//! The front door's transport: limits that hold before a request reaches the API.
//!
//! [`MessageLimitLayer`] refuses a gRPC message longer than the limit as soon as its
//! 5-byte frame header arrives, with `RESOURCE_EXHAUSTED` as gRPC's convention has it
//! (tonic's own check answers `OUT_OF_RANGE`), before any of it is buffered. Requests that
//! are not gRPC (the MCP endpoint's JSON) are bounded by their service instead.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::{Status, body::Body};

/// Wraps every request body in a [`LimitedBody`].
#[derive(Debug, Clone, Copy)]
pub struct MessageLimitLayer {
    limit: usize,
}

impl MessageLimitLayer {
    /// Returns the layer refusing messages longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        MessageLimitLayer { limit }
    }
}

impl<S> tower::Layer<S> for MessageLimitLayer {
    type Service = MessageLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageLimit { inner, limit: self.limit }
    }
}

/// The service of [`MessageLimitLayer`].
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    limit: usize,
}

impl<S> tower::Service<http::Request<Body>> for MessageLimit<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if !is_grpc(&request) {
            return self.inner.call(request);
        }
        let limit = self.limit;
        self.inner.call(request.map(|body| Body::new(LimitedBody::new(body, limit))))
    }
}

/// Returns whether `request` is a gRPC call (`content-type: application/grpc…`).
pub(crate) fn is_grpc<B>(request: &http::Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// Where the frame parser stands in the stream of gRPC messages.
#[derive(Debug, Clone, Copy)]
enum Framing {
    /// Reading a 5-byte header (compression flag, big-endian length); `read` bytes so far.
    Header { bytes: [u8; 5], read: usize },
    /// Passing over the rest of a message's body.
    Body { remaining: usize },
}

/// A request body that follows the gRPC framing as data passes and fails with
/// `RESOURCE_EXHAUSTED` at the header of a message longer than its limit.
#[derive(Debug)]
pub struct LimitedBody {
    inner: Body,
    limit: usize,
    framing: Framing,
}

impl LimitedBody {
    fn new(inner: Body, limit: usize) -> Self {
        LimitedBody { inner, limit, framing: Framing::Header { bytes: [0; 5], read: 0 } }
    }

    /// Follows the framing through `chunk`; returns the length of a message over the limit.
    fn check(&mut self, mut chunk: &[u8]) -> Result<(), usize> {
        while !chunk.is_empty() {
            match &mut self.framing {
                Framing::Body { remaining } => {
                    let skip = (*remaining).min(chunk.len());
                    *remaining -= skip;
                    chunk = &chunk[skip..];
                    if *remaining == 0 {
                        self.framing = Framing::Header { bytes: [0; 5], read: 0 };
                    }
                }
                Framing::Header { bytes, read } => {
                    let take = (5 - *read).min(chunk.len());
                    bytes[*read..*read + take].copy_from_slice(&chunk[..take]);
                    *read += take;
                    chunk = &chunk[take..];
                    if *read == 5 {
                        let len = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
                        let len = len as usize;
                        if len > self.limit {
                            return Err(len);
                        }
                        self.framing = match len {
                            0 => Framing::Header { bytes: [0; 5], read: 0 },
                            remaining => Framing::Body { remaining },
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

impl HttpBody for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref()
            && let Err(len) = self.check(data.chunk())
        {
            let limit = self.limit;
            let failure = toolmesh_core::CallFailure::new(
                toolmesh_core::ErrorCode::ResourceExhausted,
                "message_too_large",
                format!(
                    "the message is {len} bytes; at most {limit} are accepted \
                     (server.max_message_bytes)"
                ),
            );
            return Poll::Ready(Some(Err(toolmesh_proto::status(&failure))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: u32) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&len.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7, len as usize));
        bytes
    }

    #[test]
    fn follows_messages_split_anywhere_and_stops_at_an_oversized_header() {
        let mut stream: Vec<u8> = Vec::new();
        for len in [0, 3, 10, 10] {
            stream.extend(frame(len));
        }
        for split in 1..stream.len() {
            let mut body = LimitedBody::new(Body::empty(), 10);
            for chunk in stream.chunks(split) {
                assert_eq!(body.check(chunk), Ok(()), "split every {split} bytes");
            }
            assert!(matches!(body.framing, Framing::Header { read: 0, .. }));
        }
        let mut over = LimitedBody::new(Body::empty(), 10);
        assert_eq!(over.check(&frame(3)), Ok(()));
        let header = &frame(11)[..5];
        assert_eq!(over.check(&header[..2]), Ok(()));
        assert_eq!(over.check(&header[2..]), Err(11), "refused at the header, not the body");
    }
}
