//! The server side's codec: prost's encoding, and a decoder that answers a request which is
//! not valid protobuf with `INVALID_ARGUMENT`, since the bytes are the caller's (prost's own
//! codec says `INTERNAL`, which the API reserves for crashed tools).

use std::marker::PhantomData;

use prost::Message;
use tonic::{
    Status,
    codec::{BufferSettings, Codec, DecodeBuf, Decoder},
};
use tonic_prost::ProstEncoder;

/// Encodes responses with prost and decodes requests, refusing malformed ones with
/// `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct ServerCodec<T, U> {
    _messages: PhantomData<(T, U)>,
}

impl<T, U> Default for ServerCodec<T, U> {
    fn default() -> Self {
        ServerCodec { _messages: PhantomData }
    }
}

impl<T, U> Codec for ServerCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder { _message: PhantomData }
    }
}

/// Decodes one request message.
#[derive(Debug, Clone)]
pub struct RequestDecoder<U> {
    _message: PhantomData<U>,
}

impl<U: Message + Default> Decoder for RequestDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        U::decode(buf).map(Some).map_err(|error| {
            Status::invalid_argument(format!(
                "the request is not a valid protobuf message: {error}"
            ))
        })
    }
}
