//! Frames on a store's socket: a `u32` little-endian length, then that many bytes of one
//! message (`docs/FORMAT.md`, "Local socket protocol"), and the bounded readers and writers
//! of a message's fields. Pure byte code, apart from [`read_frame`] and [`write_frame`].

use std::io::{self, Read, Write};

use crate::error::{Error, Result};
use crate::limits::SERVE_FRAME_BYTES_MAX;

/// Bytes of a frame's length prefix.
const LENGTH_BYTES: usize = 4;

/// What [`read_frame`] found.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A whole message.
    Message(Vec<u8>),
    /// The peer closed the connection between frames.
    Closed,
}

/// Reads one frame. A declared length of zero or above [`SERVE_FRAME_BYTES_MAX`] is refused
/// with [`Error::Protocol`] before anything is allocated; a connection that ends inside a
/// frame is [`Error::Protocol`] too; an I/O failure is [`Error::Io`].
pub(crate) fn read_frame(reader: &mut impl Read) -> Result<Frame> {
    let mut length = [0u8; LENGTH_BYTES];
    let mut filled = 0;
    while filled < LENGTH_BYTES {
        match reader.read(&mut length[filled..]) {
            Ok(0) if filled == 0 => return Ok(Frame::Closed),
            Ok(0) => return Err(protocol("the connection ended inside a frame's length")),
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(Error::io("read a frame", "", error)),
        }
    }
    let declared = u32::from_le_bytes(length);
    if declared == 0 {
        return Err(protocol("a frame of zero bytes"));
    }
    if declared > SERVE_FRAME_BYTES_MAX {
        return Err(protocol(format!("a frame of {declared} bytes is longer than {SERVE_FRAME_BYTES_MAX}")));
    }
    let mut message = vec![0u8; declared as usize];
    reader.read_exact(&mut message).map_err(|error| match error.kind() {
        io::ErrorKind::UnexpectedEof => protocol(format!("the connection ended inside a frame of {declared} bytes")),
        _ => Error::io("read a frame", "", error),
    })?;
    Ok(Frame::Message(message))
}

/// Writes a frame [`Writer::finish`] made, in one call.
pub(crate) fn write_frame(writer: &mut impl Write, frame: &[u8]) -> Result<()> {
    debug_assert!(frame.len() > LENGTH_BYTES, "a frame holds a message");
    writer.write_all(frame).map_err(|error| Error::io("write a frame", "", error))
}

/// An [`Error::Protocol`] saying `reason`.
pub(crate) fn protocol(reason: impl Into<String>) -> Error {
    Error::Protocol { reason: reason.into() }
}

/// Builds one frame: the length prefix, the message's tag, then its fields.
pub(crate) struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// A frame whose message has `tag`.
    pub(crate) fn new(tag: u8) -> Self {
        let mut bytes = Vec::with_capacity(64);
        bytes.extend_from_slice(&[0; LENGTH_BYTES]);
        bytes.push(tag);
        Self { bytes }
    }

    pub(crate) fn u8(&mut self, value: u8) {
        self.bytes.push(value);
    }

    pub(crate) fn bool(&mut self, value: bool) {
        self.bytes.push(u8::from(value));
    }

    pub(crate) fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    pub(crate) fn i64(&mut self, value: i64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    /// A count of items that follow (`u32`; a longer list makes the frame too long anyway).
    pub(crate) fn count(&mut self, count: usize) {
        self.u32(u32::try_from(count).unwrap_or(u32::MAX));
    }

    /// Bytes, after their `u32` length.
    pub(crate) fn bytes(&mut self, value: &[u8]) {
        self.count(value.len());
        self.bytes.extend_from_slice(value);
    }

    pub(crate) fn str(&mut self, value: &str) {
        self.bytes(value.as_bytes());
    }

    /// The frame, its length filled in.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for a message above [`SERVE_FRAME_BYTES_MAX`].
    pub(crate) fn finish(mut self) -> Result<Vec<u8>> {
        let message = self.bytes.len() - LENGTH_BYTES;
        let declared = u32::try_from(message).ok().filter(|declared| *declared <= SERVE_FRAME_BYTES_MAX);
        let Some(declared) = declared else {
            let limit = u64::from(SERVE_FRAME_BYTES_MAX);
            return Err(Error::LimitExceeded { what: "bytes of a message on the store's socket".into(), limit });
        };
        self.bytes[..LENGTH_BYTES].copy_from_slice(&declared.to_le_bytes());
        Ok(self.bytes)
    }
}

/// Reads one message's fields; every length is checked against the bytes left, so a hostile
/// length allocates nothing.
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader of `message` (a frame without its length).
    pub(crate) fn new(message: &'a [u8]) -> Self {
        Self { rest: message }
    }

    fn take(&mut self, bytes: usize) -> Result<&'a [u8]> {
        if bytes > self.rest.len() {
            return Err(protocol(format!("a field of {bytes} bytes runs past the message ({} left)", self.rest.len())));
        }
        let (taken, rest) = self.rest.split_at(bytes);
        self.rest = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }

    pub(crate) fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(protocol(format!("{other} is not a boolean"))),
        }
    }

    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    pub(crate) fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A count of items of at least `item_bytes` bytes each, refused if they cannot fit in
    /// the bytes left.
    pub(crate) fn count(&mut self, item_bytes: usize) -> Result<usize> {
        debug_assert!(item_bytes > 0, "an item takes at least a byte");
        let count = self.u32()? as usize;
        if count.saturating_mul(item_bytes) > self.rest.len() {
            return Err(protocol(format!("{count} items cannot fit in the {} bytes left", self.rest.len())));
        }
        Ok(count)
    }

    pub(crate) fn bytes(&mut self) -> Result<Vec<u8>> {
        let length = self.count(1)?;
        Ok(self.take(length)?.to_vec())
    }

    pub(crate) fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?).map_err(|_| protocol("a string is not UTF-8"))
    }

    /// Refuses bytes left after the message's last field.
    pub(crate) fn end(self) -> Result<()> {
        match self.rest.len() {
            0 => Ok(()),
            left => Err(protocol(format!("{left} bytes follow the message's last field"))),
        }
    }
}
