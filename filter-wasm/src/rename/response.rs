//! The client's name back into a response, as it streams past: the value of
//! the top-level `model` of a JSON body, or of every `data:` event of an SSE
//! stream, becomes the name the client asked for (the first one of each
//! object: what follows it is not scanned). Chunk boundaries may fall
//! anywhere; a `model` value cut by one is held back until its end arrives
//! (at most [`MAX_MODEL_VALUE`] bytes), every other byte passes at once. A
//! chunk without a change is left alone (no copy). Nested objects, strings
//! that spell `"model"` and anything the scanner does not understand keep
//! their bytes.

use memchr::{memchr, memchr3};

mod skip;

pub use super::output::Emit;
use super::output::Out;
use super::{MAX_MODEL_VALUE, json_string};

/// How the body is framed (from the response's `content-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object (`application/json`).
    Json,
    /// Server-sent events (`text/event-stream`): each `data:` line one object.
    Sse,
}

impl Format {
    pub fn of(content_type: &str) -> Option<Format> {
        let ct = content_type.trim().to_ascii_lowercase();
        if ct.starts_with("application/json") {
            Some(Format::Json)
        } else if ct.starts_with("text/event-stream") {
            Some(Format::Sse)
        } else {
            None
        }
    }
}

const KEY: &[u8] = b"model";
const DATA: &[u8] = b"data:";

/// Whether the scan of a chunk goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Next,
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// SSE: at the start of a line.
    LineStart,
    /// SSE: this many bytes of `data:` matched.
    Prefix(u8),
    /// SSE: nothing to do until the next line.
    SkipLine,
    /// Before the top-level value.
    Before,
    /// JSON: past the top-level object (or not one); nothing more to do.
    Done,
    /// In the object, expecting a key.
    Key,
    /// In a key: how many bytes of `model` it matched (`None`: another key).
    KeyName {
        matched: Option<u8>,
        escaped: bool,
    },
    Colon {
        model: bool,
    },
    Value {
        model: bool,
    },
    /// In the model's string value, which is being held back.
    ModelString {
        escaped: bool,
    },
    /// In another top-level string value.
    Str {
        escaped: bool,
    },
    /// In a nested object or array.
    Nested {
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
    Scalar,
    AfterValue,
}

/// Rewrites one response body.
#[derive(Debug)]
pub struct ModelRewriter {
    format: Format,
    /// The client's name, as a JSON string.
    replacement: Vec<u8>,
    state: State,
    /// The start of a model value that began in an earlier chunk, not yet
    /// passed on.
    held: Vec<u8>,
    /// Values rewritten so far.
    pub renamed: u64,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl ModelRewriter {
    /// `client_model` is the name the client asked for.
    pub fn new(format: Format, client_model: &str) -> Self {
        ModelRewriter {
            format,
            replacement: json_string(client_model),
            state: match format {
                Format::Json => State::Before,
                Format::Sse => State::LineStart,
            },
            held: Vec::new(),
            renamed: 0,
        }
    }

    /// Bytes kept between chunks: at most [`MAX_MODEL_VALUE`].
    pub fn retained(&self) -> usize {
        self.held.len()
    }

    /// Where the top-level object ended (or turned out not to be one).
    fn past_object(&self) -> State {
        match self.format {
            Format::Json => State::Done,
            Format::Sse => State::SkipLine,
        }
    }

    /// A held model value turns out not to be one: its bytes go out as they
    /// came, before the rest of the chunk.
    fn release(&mut self, out: &mut Out<'_>, value_at: usize) {
        if !self.held.is_empty() {
            out.splice(value_at, &self.held, value_at);
            self.held.clear();
        }
    }

    /// Skips string bytes from `i` to the next quote, backslash or newline:
    /// `Some((k, byte))` where one is, `None` when the chunk ends first.
    fn string_stop(chunk: &[u8], i: usize) -> Option<(usize, u8)> {
        let rest = chunk.get(i..).unwrap_or_default();
        let k = i + memchr3(b'"', b'\\', b'\n', rest)?;
        chunk.get(k).map(|&b| (k, b))
    }

    /// The next chunk; `end` on the last one (held bytes then go out).
    pub fn push(&mut self, chunk: &[u8], end: bool) -> Emit {
        if self.state == State::Done && self.held.is_empty() {
            return Emit::Same;
        }
        let mut out = Out {
            chunk,
            copied: 0,
            buf: None,
        };
        // Where the model value being held starts in this chunk (0: earlier).
        let mut value_at = 0;
        let mut i = 0;
        while let Some(&b) = chunk.get(i) {
            if b == b'\n' && !matches!(self.state, State::LineStart | State::SkipLine) {
                match self.format {
                    // An event's line ended before its object did: next line.
                    Format::Sse => {
                        self.release(&mut out, value_at);
                        self.state = State::LineStart;
                        i += 1;
                        continue;
                    }
                    // A newline inside a string: not JSON, stop here.
                    Format::Json
                        if matches!(
                            self.state,
                            State::ModelString { .. }
                                | State::Str { .. }
                                | State::KeyName { .. }
                                | State::Nested {
                                    in_string: true,
                                    ..
                                }
                        ) =>
                    {
                        self.release(&mut out, value_at);
                        self.state = State::Done;
                        continue;
                    }
                    Format::Json => {}
                }
            }
            let step = match self.state {
                State::Done => Step::Stop,
                State::LineStart | State::Prefix(_) | State::SkipLine => self.sse(chunk, b, &mut i),
                State::Before
                | State::Key
                | State::KeyName { .. }
                | State::Colon { .. }
                | State::AfterValue => self.structure(b, &mut i),
                State::Value { .. } | State::ModelString { .. } => {
                    self.model_value(chunk, b, &mut i, &mut value_at, &mut out)
                }
                State::Str { .. } | State::Nested { .. } | State::Scalar => {
                    self.skip_value(chunk, b, &mut i)
                }
            };
            if step == Step::Stop {
                break;
            }
        }
        if matches!(self.state, State::ModelString { .. }) {
            if end {
                self.release(&mut out, value_at);
            } else {
                // Held back until the value's end arrives.
                self.held
                    .extend_from_slice(chunk.get(value_at..).unwrap_or_default());
                out.splice(value_at, &[], chunk.len());
            }
        }
        out.finish()
    }

    /// SSE framing: a line that starts with `data:` is scanned, any other skipped.
    fn sse(&mut self, chunk: &[u8], b: u8, i: &mut usize) -> Step {
        match self.state {
            State::LineStart => {
                self.state = match b {
                    b'd' => State::Prefix(1),
                    b'\n' => State::LineStart,
                    _ => State::SkipLine,
                };
                *i += 1;
            }
            State::Prefix(n) => {
                let n = usize::from(n);
                self.state = if DATA.get(n) != Some(&b) {
                    State::SkipLine
                } else if n + 1 == DATA.len() {
                    State::Before
                } else {
                    State::Prefix(n as u8 + 1)
                };
                *i += 1;
            }
            State::SkipLine => match memchr(b'\n', chunk.get(*i..).unwrap_or_default()) {
                Some(k) => {
                    *i += k + 1;
                    self.state = State::LineStart;
                }
                None => return Step::Stop,
            },
            _ => {}
        }
        Step::Next
    }

    /// A member's value starts; the `model` string is held back until its
    /// closing quote, then replaced.
    fn model_value(
        &mut self,
        chunk: &[u8],
        b: u8,
        i: &mut usize,
        value_at: &mut usize,
        out: &mut Out<'_>,
    ) -> Step {
        match self.state {
            State::Value { model } => {
                if is_ws(b) {
                    *i += 1;
                    return Step::Next;
                }
                self.state = match b {
                    b'"' if model => {
                        *value_at = *i;
                        State::ModelString { escaped: false }
                    }
                    b'"' => State::Str { escaped: false },
                    b'{' | b'[' => State::Nested {
                        depth: 1,
                        in_string: false,
                        escaped: false,
                    },
                    _ => {
                        self.state = State::Scalar;
                        return Step::Next;
                    }
                };
                *i += 1;
            }
            State::ModelString { escaped } => {
                if self.held.len() + (*i - *value_at) >= MAX_MODEL_VALUE {
                    // Too long to be a name: let it through as it is.
                    self.release(out, *value_at);
                    self.state = State::Str { escaped };
                    return Step::Next;
                }
                if !escaped && b != b'"' && b != b'\\' {
                    // Plain bytes up to the next quote, escape or newline
                    // (within the bound), at once.
                    let room = MAX_MODEL_VALUE - self.held.len() - (*i - *value_at);
                    let end = chunk.len().min(*i + room);
                    let window = chunk.get(*i..end).unwrap_or_default();
                    *i += memchr3(b'"', b'\\', b'\n', window).unwrap_or(window.len());
                    return Step::Next;
                }
                *i += 1;
                self.state = match b {
                    _ if escaped => State::ModelString { escaped: false },
                    b'\\' => State::ModelString { escaped: true },
                    b'"' => {
                        out.splice(*value_at, &self.replacement, *i);
                        self.held.clear();
                        self.renamed += 1;
                        // One model per object: the rest of the event (or
                        // body) passes unscanned.
                        self.past_object()
                    }
                    _ => State::ModelString { escaped: false },
                };
            }
            _ => {}
        }
        Step::Next
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
