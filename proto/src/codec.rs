//! The CRI services' codec: prost's, except that a message that does not decode is the
//! client's bad input (`InvalidArgument`, naming the field), not the server's failure
//! (`Internal`, which is what tonic, grpc-go and grpc-java answer).

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::{Code, Status};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// At most this much of a decode error's text goes into the status message.
const MESSAGE_LIMIT: usize = 1024;

/// [`ProstCodec`] with [`CriDecoder`] (the generated clients and servers of `runtime.v1`).
#[derive(Debug, Clone)]
pub struct CriCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for CriCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for CriCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CriDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        CriDecoder(ProstCodec::<T, U>::raw_decoder(BufferSettings::default()))
    }
}

/// prost's decoder, whose failures are `InvalidArgument`.
#[derive(Debug)]
pub struct CriDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for CriDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| match status.code() {
            Code::Internal => {
                // prost names the field path after a prefix of its own.
                let why = status.message();
                let why = why
                    .strip_prefix("failed to decode Protobuf message: ")
                    .unwrap_or(why);
                let name = std::any::type_name::<U>();
                let name = name.rsplit("::").next().unwrap_or(name);
                Status::invalid_argument(bounded(&format!("{name} does not decode: {why}")))
            }
            _ => status,
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// `text` cut to [`MESSAGE_LIMIT`] bytes at a character boundary, marked when cut.
fn bounded(text: &str) -> String {
    if text.len() <= MESSAGE_LIMIT {
        return text.to_owned();
    }
    let mut end = MESSAGE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_at_a_character() {
        assert_eq!(bounded("short"), "short");
        let long = "é".repeat(MESSAGE_LIMIT);
        let cut = bounded(&long);
        assert!(cut.len() < MESSAGE_LIMIT + 20, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} bytes)", long.len())));
    }
}
