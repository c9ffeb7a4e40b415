//! Framing: a little-endian `u32` byte length, then that many bytes of
//! `postcard`. A frame over [`MAX_FRAME_BYTES`] is a protocol error: the
//! reader refuses it before allocating, so a hostile peer cannot make the
//! other side reserve memory it did not mean to.

use serde::{Serialize, de::DeserializeOwned};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Hard ceiling for one frame. The largest legitimate message is the whole
/// catalog resource (well under 2 MiB); 16 MiB leaves room without letting a
/// peer pin unbounded memory.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

/// A writer that finds more frames queued writes at most this many bytes
/// of them at once ([`crate::outbox`]).
pub const BATCH_BYTES: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("peer closed the connection")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("i/o error on the IPC socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed IPC message: {0}")]
    Decode(#[from] postcard::Error),
}

/// Encode `msg` into one frame (length prefix included).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    // One buffer: room for the prefix, the message after it, then the
    // prefix written in.
    let mut start = Vec::with_capacity(128);
    start.extend_from_slice(&[0u8; 4]);
    let mut buf = postcard::to_extend(msg, start)?;
    let body = buf.len() - 4;
    if body > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(body));
    }
    let len = u32::try_from(body).map_err(|_| FrameError::TooLarge(body))?;
    buf[..4].copy_from_slice(&len.to_le_bytes());
    Ok(buf)
}

/// Decode one whole frame held in `frame` (a datagram that carries exactly
/// one, length prefix included): the prefix must name the rest exactly,
/// and the message must fill it.
pub fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T, FrameError> {
    let (len, body) =
        frame.split_first_chunk::<4>().ok_or(FrameError::Decode(postcard::Error::DeserializeUnexpectedEnd))?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    if len != body.len() {
        return Err(FrameError::Decode(postcard::Error::DeserializeBadEncoding));
    }
    match postcard::take_from_bytes(body)? {
        (msg, []) => Ok(msg),
        _ => Err(FrameError::Decode(postcard::Error::DeserializeBadEncoding)),
    }
}

pub async fn write_frame<W, T>(w: &mut W, msg: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let buf = encode(msg)?;
    w.write_all(&buf).await?;
    w.flush().await?;
    Ok(())
}

/// Read one frame. Returns [`FrameError::Closed`] on a clean end of stream
/// at a frame boundary.
pub async fn read_frame<R, T>(r: &mut R) -> Result<T, FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(FrameError::Io(e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(postcard::from_bytes(&body)?)
}

/// [`read_frame`] from a buffered reader: a frame already whole in the
/// buffer (the usual case: a message comes in one `recv`) is decoded where
/// it lies, with no buffer of its own and no copy; any other goes through
/// [`read_frame`]. The same answers, errors and limits as [`read_frame`].
pub async fn read_buffered_frame<R, T>(r: &mut R) -> Result<T, FrameError>
where
    R: AsyncBufRead + Unpin,
    T: DeserializeOwned,
{
    let buf = r.fill_buf().await?;
    if let Some((len, rest)) = buf.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(FrameError::TooLarge(len));
        }
        if let Some(body) = rest.get(..len) {
            let msg = postcard::from_bytes(body);
            r.consume(4 + len);
            return Ok(msg?);
        }
    }
    read_frame(r).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{JsonText, Request, ToWorker};

    #[tokio::test]
    async fn round_trip_and_limits() {
        let (mut a, mut b) = tokio::io::duplex(1 << 20);
        let msg = ToWorker::Request {
            id: 7,
            request: Request::CatalogTool {
                tool: "list_actions".into(),
                args: JsonText::from_value(&serde_json::json!({"limit": 3})),
            },
        };
        write_frame(&mut a, &msg).await.unwrap();
        let back: ToWorker = read_frame(&mut b).await.unwrap();
        assert_eq!(format!("{back:?}"), format!("{msg:?}"));

        // An oversized length prefix is refused before any allocation.
        use tokio::io::AsyncWriteExt;
        a.write_all(&((MAX_FRAME_BYTES as u32) + 1).to_le_bytes()).await.unwrap();
        let err = read_frame::<_, ToWorker>(&mut b).await.unwrap_err();
        assert!(matches!(err, FrameError::TooLarge(_)));

        drop(a);
        let err = read_frame::<_, ToWorker>(&mut b).await.unwrap_err();
        assert!(matches!(err, FrameError::Closed | FrameError::Io(_)));
    }

    /// A frame whole in the buffer, split anywhere, or never finished reads
    /// as [`read_frame`] reads it.
    #[tokio::test]
    async fn buffered_frames_read_as_read_frame_reads_them() {
        let msgs: Vec<ToWorker> = (0..3)
            .map(|id| ToWorker::Request {
                id,
                request: Request::CatalogTool {
                    tool: "list_actions".into(),
                    args: JsonText::from_value(&serde_json::json!({"limit": id})),
                },
            })
            .collect();
        let mut bytes = Vec::new();
        for m in &msgs {
            bytes.extend_from_slice(&encode(m).unwrap());
        }
        // Every buffer size: frames whole in it, and frames split across
        // reads (the length prefix too).
        for cap in 1..=bytes.len() + 1 {
            let mut r = tokio::io::BufReader::with_capacity(cap, &bytes[..]);
            for m in &msgs {
                let back: ToWorker = read_buffered_frame(&mut r).await.unwrap();
                assert_eq!(format!("{back:?}"), format!("{m:?}"), "buffer of {cap}");
            }
            assert!(matches!(read_buffered_frame::<_, ToWorker>(&mut r).await, Err(FrameError::Closed)));
        }
        // Cut anywhere: the stream ends inside a frame (or between two).
        for cut in 1..bytes.len() {
            let mut r = tokio::io::BufReader::with_capacity(64, &bytes[..cut]);
            let mut seen = 0;
            let err = loop {
                match read_buffered_frame::<_, ToWorker>(&mut r).await {
                    Ok(_) => seen += 1,
                    Err(e) => break e,
                }
            };
            assert!(seen < msgs.len() && matches!(err, FrameError::Closed | FrameError::Io(_)), "cut at {cut}");
        }
        // Too large: refused from the prefix alone; garbage: a decode error.
        let mut too_large = ((MAX_FRAME_BYTES as u32) + 1).to_le_bytes().to_vec();
        too_large.extend_from_slice(&[0; 8]);
        let mut r = tokio::io::BufReader::new(&too_large[..]);
        assert!(matches!(read_buffered_frame::<_, ToWorker>(&mut r).await, Err(FrameError::TooLarge(_))));
        let garbage = [3, 0, 0, 0, 0xff, 0xff, 0xff];
        let mut r = tokio::io::BufReader::new(&garbage[..]);
        assert!(matches!(read_buffered_frame::<_, ToWorker>(&mut r).await, Err(FrameError::Decode(_))));
    }

    #[tokio::test]
    async fn garbage_is_a_decode_error() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        use tokio::io::AsyncWriteExt;
        a.write_all(&3u32.to_le_bytes()).await.unwrap();
        a.write_all(&[0xff, 0xff, 0xff]).await.unwrap();
        let err = read_frame::<_, ToWorker>(&mut b).await.unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)));
    }
}
