//! A minimal zero-copy reader of the protobuf wire format, for the hot paths that must not
//! allocate (replay reads a delta's fields in place instead of decoding it into owned strings).
//!
//! It accepts less than prost does: anything it does not expect (groups, a field number 0, an
//! over-long varint, a length past the end) is [`Unusual`], and the caller then decodes the
//! record with prost, which either accepts it (with its exact merge semantics) or reports the
//! precise error. So this reader never has to reproduce prost's corner cases, only agree with it
//! on the inputs it accepts; the tests of `delta_view.rs` check that agreement.

use std::ops::Range;

/// The input is not one the zero-copy readers handle; decode it with prost instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Unusual;

/// A byte range of the message being read (`u32` offsets: records are far below 4 GiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    end: u32,
}

impl Span {
    /// The bytes this span covers in `bytes` (empty if it lies outside them).
    #[inline]
    pub fn of<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        bytes.get(self.start as usize..self.end as usize).unwrap_or_default()
    }

    /// The UTF-8 text this span covers in `bytes`.
    ///
    /// # Errors
    /// [`Unusual`] if those bytes are not UTF-8.
    #[inline]
    pub fn text<'a>(&self, bytes: &'a [u8]) -> Result<&'a str, Unusual> {
        std::str::from_utf8(self.of(bytes)).map_err(|_| Unusual)
    }

    /// The byte range this span covers.
    pub fn range(&self) -> Range<usize> {
        self.start as usize..self.end as usize
    }

    /// The span of `range` shifted by `base`.
    fn at(base: usize, range: Range<usize>) -> Result<Self, Unusual> {
        let start = u32::try_from(base + range.start).map_err(|_| Unusual)?;
        let end = u32::try_from(base + range.end).map_err(|_| Unusual)?;
        Ok(Self { start, end })
    }
}

/// The largest protobuf field number.
const FIELD_NUMBER_MAX: u32 = (1 << 29) - 1;

/// One field's value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Value {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 2: the payload's span.
    Bytes(Span),
    /// Wire types 1 and 5, which no hot-path field uses: skipped.
    Fixed,
}

/// Reads the fields of one message, front to back.
pub(crate) struct Fields<'a> {
    bytes: &'a [u8],
    /// Offset of `bytes` within the outermost message, so that spans index that message.
    base: usize,
    at: usize,
}

impl<'a> Fields<'a> {
    /// The fields of the message `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, base: 0, at: 0 }
    }

    /// The fields of the embedded message at `span` of `outer` (the outermost message).
    pub fn nested(outer: &'a [u8], span: Span) -> Self {
        Self { bytes: span.of(outer), base: span.start as usize, at: 0 }
    }

    /// The next field number and value, `None` at the end.
    #[inline]
    pub fn next_field(&mut self) -> Option<Result<(u32, Value), Unusual>> {
        if self.at >= self.bytes.len() {
            return None;
        }
        Some(self.read_field())
    }

    #[inline]
    fn read_field(&mut self) -> Result<(u32, Value), Unusual> {
        // prost refuses a key above `u32::MAX` and a field number of 0 or above 2^29 - 1; so
        // does this reader (the fuzz target `replay_decode` found the first one missing).
        let key = u32::try_from(self.varint()?).map_err(|_| Unusual)?;
        let field = key >> 3;
        if field == 0 || field > FIELD_NUMBER_MAX {
            return Err(Unusual);
        }
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.skip(8)?,
            2 => {
                let len = usize::try_from(self.varint()?).map_err(|_| Unusual)?;
                let end = self.at.checked_add(len).filter(|end| *end <= self.bytes.len()).ok_or(Unusual)?;
                let span = Span::at(self.base, self.at..end)?;
                self.at = end;
                Value::Bytes(span)
            }
            5 => self.skip(4)?,
            _ => return Err(Unusual),
        };
        Ok((field, value))
    }

    fn skip(&mut self, len: usize) -> Result<Value, Unusual> {
        self.at = self.at.checked_add(len).filter(|end| *end <= self.bytes.len()).ok_or(Unusual)?;
        Ok(Value::Fixed)
    }

    /// A LEB128 varint of at most 10 bytes whose value fits 64 bits.
    #[inline]
    fn varint(&mut self) -> Result<u64, Unusual> {
        // Tags and short lengths take one byte.
        if let Some(&byte) = self.bytes.get(self.at)
            && byte < 0x80
        {
            self.at += 1;
            return Ok(u64::from(byte));
        }
        let mut value = 0u64;
        for i in 0..10 {
            let byte = *self.bytes.get(self.at + i).ok_or(Unusual)?;
            if i == 9 && byte > 1 {
                return Err(Unusual);
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.at += i + 1;
                return Ok(value);
            }
        }
        Err(Unusual)
    }
}

/// A varint field's value; a field of another wire type is [`Unusual`] (prost rejects it).
#[inline]
pub(crate) fn varint(value: Value) -> Result<u64, Unusual> {
    match value {
        Value::Varint(value) => Ok(value),
        _ => Err(Unusual),
    }
}

/// A length-delimited field's span; a field of another wire type is [`Unusual`].
#[inline]
pub(crate) fn bytes(value: Value) -> Result<Span, Unusual> {
    match value {
        Value::Bytes(span) => Ok(span),
        _ => Err(Unusual),
    }
}

/// A string field's span, checked to be UTF-8 (prost rejects a string that is not).
#[inline]
pub(crate) fn text(message: &[u8], value: Value) -> Result<Span, Unusual> {
    let span = bytes(value)?;
    span.text(message)?;
    Ok(span)
}
