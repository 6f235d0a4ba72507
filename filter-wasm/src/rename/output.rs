//! A response chunk as it is passed on: unchanged (no copy) until the first
//! byte that differs, then built in a buffer.

use super::MAX_MODEL_VALUE;

/// What to pass on for a chunk.
#[derive(Debug, PartialEq, Eq)]
pub enum Emit {
    /// The chunk as it is.
    Same,
    /// These bytes instead.
    Bytes(Vec<u8>),
}

/// The output of one chunk, built only once something differs.
pub(super) struct Out<'c> {
    pub(super) chunk: &'c [u8],
    /// `chunk[..copied]` is in `buf` already (or, with no `buf`, unchanged).
    pub(super) copied: usize,
    pub(super) buf: Option<Vec<u8>>,
}

impl Out<'_> {
    /// The chunk up to `to` as it is, then `extra`; `chunk[to..skip_to]` dropped.
    pub(super) fn splice(&mut self, to: usize, extra: &[u8], skip_to: usize) {
        let chunk = self.chunk;
        let buf = self
            .buf
            .get_or_insert_with(|| Vec::with_capacity(chunk.len() + MAX_MODEL_VALUE));
        buf.extend_from_slice(chunk.get(self.copied..to).unwrap_or_default());
        buf.extend_from_slice(extra);
        self.copied = skip_to;
    }

    pub(super) fn finish(self) -> Emit {
        match self.buf {
            None => Emit::Same,
            Some(mut buf) => {
                buf.extend_from_slice(self.chunk.get(self.copied..).unwrap_or_default());
                Emit::Bytes(buf)
            }
        }
    }
}
