//! What a response says about itself, read chunk by chunk as it passes: the
//! `usage` object (of a JSON body, or of the SSE event that carries it) and,
//! for SSE, whether the stream reached `data: [DONE]` and how many data
//! events streamed (a stream cut before its usage is charged for them: one
//! token per event, as engines stream). Whatever the chunk
//! boundaries; nothing is kept but the usage object itself (bounded) and the
//! last few bytes of the previous chunk. Between matches the bytes are skipped
//! by substring search, not looked at one by one. The result reaches Envoy's
//! access log as a [`UsageTag`].

use memchr::memmem;
use serde::Deserialize;

use crate::contract::UsageTag;

const KEY: &[u8] = b"\"usage\"";
/// llama.cpp's `timings`: `cache_n` is its cached prompt tokens, for the
/// releases whose `usage` has no `prompt_tokens_details`.
const TIMINGS: &[u8] = b"\"timings\"";
/// `data: [DONE]` at the start of a line.
const DONE: &[u8] = b"\ndata: [DONE]";
/// A data line (an SSE event), with or without a space after the colon.
const EVENT: &[u8] = b"\ndata:";
/// A usage object larger than this is not one we can use.
pub const MAX_OBJECT: usize = 4096;

/// Bytes of the previous chunk kept to find a needle split across two.
pub const TAIL: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Usage,
    Timings,
}

impl Key {
    fn needle(self) -> &'static [u8] {
        match self {
            Key::Usage => KEY,
            Key::Timings => TIMINGS,
        }
    }
}

#[derive(Debug)]
enum State {
    /// Looking for the `"usage"` or `"timings"` key.
    Seek,
    /// Found a key: skipping `:` and blanks up to the value.
    Value(Key),
    /// Inside the object: its bytes so far, brace depth, string state.
    Object {
        key: Key,
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
}

/// Scans one response body.
#[derive(Debug)]
pub struct UsageScanner {
    state: State,
    object: Vec<u8>,
    /// The last bytes seen; starts as a newline (the body begins a line).
    tail: Vec<u8>,
    /// Data lines seen, `[DONE]` included.
    events: u64,
    pub tag: UsageTag,
}

impl Default for UsageScanner {
    fn default() -> Self {
        UsageScanner {
            state: State::Seek,
            object: Vec::new(),
            tail: b"\n".to_vec(),
            events: 0,
            tag: UsageTag::default(),
        }
    }
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Timings {
    #[serde(default)]
    cache_n: Option<u64>,
}

/// Finds the keys in one chunk, each needle's next match remembered so a
/// chunk is searched once per needle however many keys it holds (a `"usage"`
/// per SSE event, a `"timings"` in the last one at most).
struct Keys<'a> {
    chunk: &'a [u8],
    /// Per key: the next match's start at or after the last search, `None`
    /// once none is left; unset before the first search.
    next: [Option<Option<usize>>; 2],
}

impl<'a> Keys<'a> {
    fn new(chunk: &'a [u8]) -> Self {
        Keys {
            chunk,
            next: [None, None],
        }
    }

    /// The first key starting at or after `pos`: where it ends, and which.
    /// `timings`: llama.cpp's `"timings"` too, only worth a search after a
    /// usage without its cached count (llama.cpp writes it after the usage).
    fn find(&mut self, pos: usize, timings: bool) -> Option<(usize, Key)> {
        let chunk = self.chunk;
        let wanted = if timings { 2 } else { 1 };
        [Key::Usage, Key::Timings]
            .into_iter()
            .zip(self.next.iter_mut())
            .take(wanted)
            .filter_map(|(k, next)| {
                let stale = match *next {
                    None => true,
                    Some(Some(at)) => at < pos,
                    Some(None) => false,
                };
                if stale {
                    let rest = chunk.get(pos..).unwrap_or_default();
                    *next = Some(memmem::find(rest, k.needle()).map(|i| pos + i));
                }
                next.flatten().map(|at| (at + k.needle().len(), k))
            })
            .min_by_key(|&(end, _)| end)
    }
}

/// Longest needle `across` looks for.
const NEEDLE_MAX: usize = 16;
const _: () = assert!(
    KEY.len() <= NEEDLE_MAX
        && TIMINGS.len() <= NEEDLE_MAX
        && DONE.len() <= NEEDLE_MAX
        && EVENT.len() <= NEEDLE_MAX
);

/// Where `needle` ends in `chunk` when it starts in `tail` (the previous
/// chunk's last bytes) and ends in `chunk`.
fn across(tail: &[u8], chunk: &[u8], needle: &[u8]) -> Option<usize> {
    let head = chunk
        .get(..chunk.len().min(needle.len().saturating_sub(1)))
        .unwrap_or_default();
    // On the stack: the tail is at most TAIL bytes, a needle at most
    // NEEDLE_MAX (checked at compile time below).
    let mut buf = [0u8; TAIL + NEEDLE_MAX];
    let len = tail.len() + head.len();
    let joined = buf.get_mut(..len)?;
    let (t, h) = joined.split_at_mut(tail.len());
    t.copy_from_slice(tail);
    h.copy_from_slice(head);
    let joined = &*joined;
    let from = tail.len().saturating_sub(needle.len().saturating_sub(1));
    memmem::find_iter(joined.get(from..).unwrap_or_default(), needle)
        .map(|i| from + i + needle.len())
        .find(|&end| end > tail.len())
        .map(|end| end - tail.len())
}

impl UsageScanner {
    /// Feeds the next chunk. Returns true when the tag changed (usage found,
    /// or the stream's end seen): the moment to hand it to Envoy again.
    pub fn push(&mut self, chunk: &[u8]) -> bool {
        let mut changed = false;
        let events = u64::from(across(&self.tail, chunk, EVENT).is_some())
            + memmem::find_iter(chunk, EVENT).count() as u64;
        if events > 0 {
            self.events += events;
            // Only needed while no usage has come: then it is what is charged.
            changed |= self.tag.usage.is_none();
        }
        if !self.tag.done
            && (across(&self.tail, chunk, DONE).is_some() || memmem::find(chunk, DONE).is_some())
        {
            self.tag.done = true;
            changed = true;
        }
        let mut pos = self.split_key(chunk);
        let mut keys = Keys::new(chunk);
        while pos < chunk.len() {
            match &mut self.state {
                State::Seek => match keys.find(pos, self.wants_timings()) {
                    Some((end, k)) => {
                        pos = end;
                        self.state = State::Value(k);
                    }
                    None => break,
                },
                State::Value(key) => {
                    let key = *key;
                    let Some(&b) = chunk.get(pos) else { break };
                    pos += 1;
                    match b {
                        b':' | b' ' | b'\t' | b'\r' | b'\n' => {}
                        b'{' => {
                            self.object.clear();
                            self.object.push(b);
                            self.state = State::Object {
                                key,
                                depth: 1,
                                in_string: false,
                                escaped: false,
                            };
                        }
                        // `null` or anything else: look for the next one.
                        _ => self.state = State::Seek,
                    }
                }
                State::Object {
                    key,
                    depth,
                    in_string,
                    escaped,
                } => {
                    let key = *key;
                    let Some(&b) = chunk.get(pos) else { break };
                    pos += 1;
                    if self.object.len() == MAX_OBJECT {
                        self.state = State::Seek;
                        continue;
                    }
                    self.object.push(b);
                    if *in_string {
                        if *escaped {
                            *escaped = false;
                        } else if b == b'\\' {
                            *escaped = true;
                        } else if b == b'"' {
                            *in_string = false;
                        }
                    } else if b == b'"' {
                        *in_string = true;
                    } else if b == b'{' {
                        *depth += 1;
                    } else if b == b'}' {
                        *depth -= 1;
                        if *depth == 0 {
                            self.state = State::Seek;
                            changed |= self.parse_object(key);
                        }
                    }
                }
            }
        }
        self.tag.streamed = self.events - u64::from(self.tag.done);
        // Keep the last bytes for a needle split across this chunk and the next.
        if chunk.len() >= TAIL {
            self.tail.clear();
            self.tail
                .extend_from_slice(chunk.get(chunk.len() - TAIL..).unwrap_or_default());
        } else {
            self.tail.extend_from_slice(chunk);
            let excess = self.tail.len().saturating_sub(TAIL);
            self.tail.drain(..excess);
        }
        changed
    }

    /// A key split across the previous chunk and this one: where in this
    /// chunk scanning resumes (0 if none).
    fn split_key(&mut self, chunk: &[u8]) -> usize {
        if !matches!(self.state, State::Seek) {
            return 0;
        }
        let keys: &[Key] = if self.wants_timings() {
            &[Key::Usage, Key::Timings]
        } else {
            &[Key::Usage]
        };
        let split = keys
            .iter()
            .find_map(|&k| across(&self.tail, chunk, k.needle()).map(|end| (end, k)));
        match split {
            Some((end, k)) => {
                self.state = State::Value(k);
                end
            }
            None => 0,
        }
    }

    /// A usage came without its cached count: llama.cpp's `timings` may
    /// follow with it.
    fn wants_timings(&self) -> bool {
        matches!(self.tag.usage, Some((_, _, None)))
    }

    /// Bytes held between chunks: at most [`MAX_OBJECT`] + [`TAIL`], whatever
    /// the body.
    pub fn retained(&self) -> usize {
        self.object.len() + self.tail.len()
    }

    fn parse_object(&mut self, key: Key) -> bool {
        match key {
            Key::Usage => {
                let Ok(u) = serde_json::from_slice::<Usage>(&self.object) else {
                    return false;
                };
                let cached = u.prompt_tokens_details.and_then(|d| d.cached_tokens);
                self.tag.usage = Some((u.prompt_tokens, u.completion_tokens, cached));
                true
            }
            // After the usage it completes, as llama.cpp writes it.
            Key::Timings => {
                let Ok(t) = serde_json::from_slice::<Timings>(&self.object) else {
                    return false;
                };
                let Some(n) = t.cache_n else { return false };
                match &mut self.tag.usage {
                    Some((_, _, cached @ None)) => {
                        *cached = Some(n);
                        true
                    }
                    _ => false,
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
